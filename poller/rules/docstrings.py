"""The string after each field of a class (``name: int`` then ``\"\"\"what it is\"\"\"``):
how the settings and the management API's shapes document their fields, read back
for the docs' configuration table and the OpenAPI document."""

from __future__ import annotations

import ast
import inspect


def attribute_docs(source: str) -> dict[str, dict[str, str]]:
    """By class name, each field's docstring (cleaned as :func:`inspect.cleandoc` does)."""
    found: dict[str, dict[str, str]] = {}
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ClassDef):
            continue
        docs = found.setdefault(node.name, {})
        for field, after in zip(node.body, node.body[1:], strict=False):
            if (
                isinstance(field, ast.AnnAssign)
                and isinstance(field.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                docs[field.target.id] = inspect.cleandoc(after.value.value)
    return found
