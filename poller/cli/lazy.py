"""Modules a command module imports when one of its commands first uses them.

``poller admin --help`` loads poller/cli/admin.py to list its commands; if that
imported the core (SQLAlchemy, pydantic, cryptography) at the top, listing
them would take a second. A command module names the core modules it uses as

    if TYPE_CHECKING:
        from poller.operate import admin as api
    else:
        api = lazy("poller.operate.admin")

and uses them as modules (``api.retry(...)``): mypy sees the real module, and
the import happens at the first attribute a command reads (the standard
library's :class:`importlib.util.LazyLoader`).
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType


def lazy(name: str) -> ModuleType:
    """Module ``name``, executed when one of its attributes is first read."""
    found = sys.modules.get(name)
    if found is not None:
        return found
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:  # pragma: no cover - a typo in a module name
        raise ModuleNotFoundError(name)
    loader = importlib.util.LazyLoader(spec.loader)
    spec.loader = loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    loader.exec_module(module)
    parent, _, leaf = name.rpartition(".")
    if parent:  # as an import would: `poller.operate.admin` is an attribute of `poller`
        setattr(sys.modules[parent], leaf, module)
    return module
