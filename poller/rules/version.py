"""The installed package's version: what the User-Agent, the spans and the OpenAPI
document say (``poller.__version__`` is the same)."""

from __future__ import annotations

import functools
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as installed


@functools.cache
def version() -> str:
    """``webhook-poller``'s version, or 0.0.0 from a bare source tree."""
    try:
        return installed("webhook-poller")
    except PackageNotFoundError:  # pragma: no cover - running from a bare source tree
        return "0.0.0"
