"""MkDocs hook: reference pages generated from the code, so they cannot drift.

``<!-- settings -->`` becomes the table of every setting (from
:class:`poller.settings.Settings`: name, environment variable, default and the
attribute's docstring); ``<!-- errors -->`` the tree of :mod:`poller.errors`;
``<!-- sqlstates -->`` the SQLSTATE of each error the SQL doors raise;
``<!-- modules -->`` the module map (each module's docstring, first paragraph);
``<!-- readme -->`` the README, whose links point into docs/, as the home page;
``<!-- openapi -->`` the management API's routes, from docs/api/openapi.json (the
document the code makes: tests/integration/test_openapi.py keeps the two equal).
A setting or a module without a docstring fails the build.
"""

from __future__ import annotations

import ast
import inspect
import json
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def _attribute_docs(path: Path, class_name: str) -> dict[str, str]:
    from poller.rules.docstrings import attribute_docs

    return attribute_docs(path.read_text()).get(class_name, {})


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


def sqlstate_table() -> str:
    """Each SQLSTATE of the SQL doors (poller.errors.SQLSTATES) and its error class."""
    from poller import errors

    rows = ["| SQLSTATE | Python error | when |", "| --- | --- | --- |"]
    for code, cls in errors.SQLSTATES.items():
        first = _markdown((inspect.getdoc(cls) or "").split("\n\n")[0]).replace("|", "\\|")
        rows.append(f"| `{code}` | `{cls.__name__}` | {first} |")
    return "\n".join(rows)


def readme() -> str:
    """README.md as the site's home page: its links to docs/… made relative to the site."""
    text = (ROOT / "README.md").read_text()
    text = text.replace("](docs/", "](").replace("](CHANGELOG.md)", "](changelog.md)")
    return text.replace("](examples/first_webhook.py)", "](tutorials/first-webhook.md)")


_ROLE = re.compile(r":(?:func|class|mod|data|attr|meth|exc|obj):<code>(~?)([^<]*)</code>")


def on_page_content(html: str, **_: Any) -> str:
    """What the generators leave raw: a Sphinx role in a docstring (mkdocstrings reads
    the reStructuredText fields, not the roles) becomes the code it names (``~`` its
    last part, as Sphinx shows it); click's ``Sentinel.UNSET`` (an option with no
    default) an empty cell of the CLI's tables."""
    html = _ROLE.sub(
        lambda m: f"<code>{m.group(2).rpartition('.')[2] if m.group(1) else m.group(2)}</code>",
        html,
    )
    return html.replace("<code>Sentinel.UNSET</code>", "")


GENERATED = ("settings", "errors", "sqlstates", "openapi", "modules")
"""The reference sections written from the code into the pages themselves, between
``<!-- name -->`` and ``<!-- /name -->``: readable in the repository as on the site.
``make reference`` rewrites them; tests/unit/test_docs.py fails while one is stale."""


def _section(name: str) -> str:
    return {
        "settings": settings_table,
        "errors": error_tree,
        "sqlstates": sqlstate_table,
        "openapi": openapi_reference,
        "modules": module_map,
    }[name]()


def regenerate(markdown: str) -> str:
    """``markdown`` with each generated section as the code makes it now."""
    for name in GENERATED:
        opening, closing = f"<!-- {name} -->", f"<!-- /{name} -->"
        if opening not in markdown:
            continue
        before, _, rest = markdown.partition(opening)
        _, found, after = rest.partition(closing)
        if not found:  # a section never written: everything after the marker stays
            after = rest
        markdown = f"{before}{opening}\n{_section(name)}\n{closing}{after}"
    return markdown


def write_all() -> list[Path]:
    """Rewrite every page's generated sections; the pages that changed."""
    changed = []
    for page in sorted((ROOT / "docs").rglob("*.md")):
        text = page.read_text()
        if (new := regenerate(text)) != text:
            page.write_text(new)
            changed.append(page)
    return changed


def on_page_markdown(markdown: str, **_: Any) -> str:
    if "<!-- readme -->" in markdown:
        markdown = markdown.replace("<!-- readme -->", readme())
    return regenerate(markdown)


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


def _type(schema: dict[str, Any]) -> str:
    """A schema's type in a few characters: ``string``, ``Endpoint``, ``array of number``."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[1]
        return f"[{name}](#{name.lower()})"
    if "anyOf" in schema:
        return " or ".join(_type(s) for s in schema["anyOf"])
    if "enum" in schema:
        return " \\| ".join(f"`{v}`" for v in schema["enum"])
    kind = schema.get("type")
    if kind == "array":
        return f"array of {_type(schema.get('items', {}))}"
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        return f"object of {_type(schema['additionalProperties'])}"
    if kind is None:
        return "any JSON"
    return f"{kind} ({schema['format']})" if "format" in schema else str(kind)


def _fields(schema: dict[str, Any]) -> list[str]:
    required = set(schema.get("required", []))
    rows = ["| field | type | |", "| --- | --- | --- |"]
    for name, prop in schema.get("properties", {}).items():
        need = "**required** " if name in required and "additionalProperties" in schema else ""
        text = prop.get("description", "").replace("|", "\\|")
        rows.append(f"| `{name}` | {_type(prop)} | {need}{text} |")
    return rows


def openapi_reference() -> str:
    """Every operation of docs/api/openapi.json by tag, then every schema's fields."""
    doc = json.loads((ROOT / "docs" / "api" / "openapi.json").read_text())
    by_tag: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            by_tag.setdefault(op["tags"][0], []).append((method.upper(), path, op))
    lines: list[str] = []
    for tag, ops in by_tag.items():
        lines += [f"### {tag}", ""]
        for method, path, op in ops:
            lines += [f"#### {op['summary']}", "", f"`{method} {path}` · `{op['operationId']}`", ""]
            lines += [op.get("description", ""), ""]
            params = op.get("parameters", [])
            if params:
                lines += ["| parameter | in | type | |", "| --- | --- | --- | --- |"]
                lines += [f"| `{p['name']}` | {p['in']} | {_type(p['schema'])} | "
                          f"{p.get('description', '')} |" for p in params]  # fmt: skip
                lines.append("")
            if "requestBody" in op:
                body = op["requestBody"]["content"]["application/json"]["schema"]
                lines += [f"Body: {_type(body)}", ""]
            answers = []
            for status, answer in op["responses"].items():
                if "$ref" in answer:
                    answers.append(status)
                else:
                    shape = answer["content"]["application/json"]["schema"]
                    answers.append(f"**{status}** {_type(shape)}")
            lines += ["Answers: " + ", ".join(answers) + " (a problem for each error).", ""]
    lines += ["### Schemas", ""]
    for name, schema in doc["components"]["schemas"].items():
        lines += [f"#### {name}", "", schema.get("description", ""), ""]
        lines += [*_fields(schema), ""]
    return "\n".join(lines)


if __name__ == "__main__":  # make reference
    for page in write_all():
        print(f"wrote {page.relative_to(ROOT)}")
