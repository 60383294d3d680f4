"""MkDocs hook: reference pages generated from the code, so they cannot drift.

``<!-- settings -->`` becomes the table of every setting (from
:class:`poller.settings.Settings`: name, environment variable, default and the
attribute's docstring); ``<!-- errors -->`` the tree of :mod:`poller.errors`;
``<!-- modules -->`` the module map (each module's docstring, first paragraph);
``<!-- readme -->`` the README, whose links point into docs/, as the home page.
A setting or a module without a docstring fails the build.
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def _attribute_docs(path: Path, class_name: str) -> dict[str, str]:
    tree = ast.parse(path.read_text())
    found: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            body = node.body
            for here, after in zip(body, body[1:], strict=False):
                if (
                    isinstance(here, ast.AnnAssign)
                    and isinstance(here.target, ast.Name)
                    and isinstance(after, ast.Expr)
                    and isinstance(after.value, ast.Constant)
                    and isinstance(after.value.value, str)
                ):
                    found[here.target.id] = inspect.cleandoc(after.value.value)
    return found


def _markdown(text: str) -> str:
    """A docstring's reST (``code``, :func:`name`) as Markdown, on one line."""
    text = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", " ".join(text.split()))
    return text.replace("``", "`").replace("|", "\\|")


def _default(field: Any) -> str:
    value = field.default
    if value is None:
        return "unset"
    if isinstance(value, tuple):
        return "[" + ", ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value) + "]"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def settings_table() -> str:
    from poller.settings import Settings

    docs = _attribute_docs(ROOT / "poller" / "settings.py", "Settings")
    missing = sorted(set(Settings.model_fields) - set(docs))
    if missing:
        raise ValueError(f"settings without a docstring (poller/settings.py): {missing}")
    rows = ["| Variable | Default | Meaning |", "| --- | --- | --- |"]
    for name, field in Settings.model_fields.items():
        text = _markdown(docs[name])
        rows.append(f"| `POLLER_{name.upper()}` | `{_default(field)}` | {text} |")
    return "\n".join(rows)


def error_tree() -> str:
    from poller import errors

    classes = [
        c
        for c in vars(errors).values()
        if isinstance(c, type) and issubclass(c, errors.PollerError)
    ]

    def children(parent: type) -> list[type]:
        return sorted(
            (c for c in classes if c.__mro__[1] is parent or (c.__bases__[0] is parent)),
            key=lambda c: c.__name__,
        )

    lines: list[str] = []

    def walk(node: type, depth: int) -> None:
        doc = inspect.getdoc(node) or ""
        first = _markdown(doc.split("\n\n")[0])
        builtins = [b.__name__ for b in node.__bases__ if b.__module__ == "builtins"]
        also = f" *(also {', '.join(builtins)})*" if builtins else ""
        lines.append(f"{'    ' * depth}- **`{node.__name__}`**{also}: {first}")
        for child in children(node):
            walk(child, depth + 1)

    walk(errors.PollerError, 0)
    return "\n".join(lines)


def readme() -> str:
    """README.md as the site's home page: its links to docs/… made relative to the site."""
    text = (ROOT / "README.md").read_text()
    text = text.replace("](docs/", "](").replace("](CHANGELOG.md)", "](changelog.md)")
    return text.replace("](examples/first_webhook.py)", "](tutorials/first-webhook.md)")


def on_page_markdown(markdown: str, **_: Any) -> str:
    if "<!-- readme -->" in markdown:
        markdown = markdown.replace("<!-- readme -->", readme())
    if "<!-- settings -->" in markdown:
        markdown = markdown.replace("<!-- settings -->", settings_table())
    if "<!-- modules -->" in markdown:
        markdown = markdown.replace("<!-- modules -->", module_map())
    if "<!-- errors -->" in markdown:
        markdown = markdown.replace("<!-- errors -->", error_tree())
    return markdown


def module_map() -> str:
    """One line per module of poller/: its path and the first line of its docstring."""
    rows = ["| module | role |", "| --- | --- |"]
    missing = []
    for path in sorted((ROOT / "poller").rglob("*.py")):
        relative = path.relative_to(ROOT)
        doc = ast.get_docstring(ast.parse(path.read_text()))
        if not doc:
            if path.name == "__main__.py":
                doc = "``python -m poller``: the ``poller`` command."
            else:
                missing.append(str(relative))
                continue
        rows.append(f"| `{relative}` | {_markdown(doc.split(chr(10) * 2)[0])} |")
    if missing:
        raise ValueError(f"modules without a docstring: {missing}")
    return "\n".join(rows)
