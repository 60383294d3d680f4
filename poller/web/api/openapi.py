"""The management API's OpenAPI 3.1 document, made from the code: the route table
(poller/web/api/routes.py), what each route declares it takes and answers
(:class:`poller.web.api.rest.Spec`) and the shapes of its bodies
(poller/web/api/shapes.py, their docstrings the descriptions).

``poller serve`` serves it at ``GET /api/v1/openapi.json``, to anyone (it holds
nothing an operator would keep from a client). The copy in the repository,
``docs/api/openapi.json``, is what the docs' API reference is made from; a test fails
when the two differ, so a change to the API shows as a diff of that file
(``make openapi`` writes it).
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from functools import cache
from typing import Any

from pydantic import TypeAdapter
from starlette.requests import Request
from starlette.responses import Response

from poller.rules.docstrings import attribute_docs
from poller.web.api import shapes
from poller.web.api.rest import Spec

VERSION = "3.1.0"
PREFIX = "/api/v1"
REF = "#/components/schemas/{model}"
PROBLEMS = {
    401: "No credentials, or wrong ones: send `Authorization: Bearer <token>`",
    403: "A change by a read-only token or dashboard, or one only an admin may make",
    404: "No such thing, or another tenant's",
    409: "The state does not allow it, or an idempotency key was used for another request",
    413: "The body is over its limit",
    415: "A change without `Content-Type: application/json`",
    422: "Input that cannot be used: `errors` says which fields",
    429: "Over the per-token rate (`Retry-After` says when to try again)",
    503: "The database is not answering; try again",
}
CHANGE_PROBLEMS = (403, 413, 415)


@dataclass(frozen=True, slots=True)
class Operation:
    """One route: ``method`` on ``path`` (Starlette's form) runs ``handler``."""

    method: str
    path: str
    """Below ``/api/v1``, in Starlette's form (``{name:path}``)."""
    handler: Callable[[Request], Awaitable[Response]]
    id: str
    """The operationId: what a generated client calls the method."""
    summary: str
    """A few words; the handler's docstring is the description."""

    @property
    def spec(self) -> Spec:
        spec: Spec = getattr(self.handler, "spec")  # noqa: B009 (set by rest.api)
        return spec

    @property
    def route(self) -> str:
        return PREFIX + self.path

    @property
    def template(self) -> str:
        """The path as OpenAPI writes it (``{name:path}`` → ``{name}``)."""
        return re.sub(r"\{(\w+):\w+\}", r"{\1}", self.route)


def document(operations: Iterable[Operation], version: str) -> dict[str, Any]:
    """The OpenAPI 3.1 document of these operations."""
    ops = list(operations)
    paths: dict[str, dict[str, Any]] = {}
    for op in ops:
        paths.setdefault(op.template, {})[op.method.lower()] = _operation(op)
    used: set[type] = {shapes.Problem}
    for op in ops:
        used.update(op.spec.answers.values())
        if op.spec.body is not None:
            used.add(op.spec.body)
    return {
        "openapi": VERSION,
        "info": {
            "title": "webhook-poller management API",
            "version": version,
            "description": "Endpoints, messages, events and the event-type catalog of "
            "one webhook-poller database, served by `poller serve` under `/api/v1`.",
            "license": {"name": "MIT", "identifier": "MIT"},
        },
        "security": [{"token": []}, {"operator": []}],
        "tags": [{"name": t} for t in dict.fromkeys(_tag(op) for op in ops)],
        "paths": paths,
        "components": {
            "schemas": schemas(sorted(used, key=lambda t: t.__name__)),
            "responses": {
                str(status): {
                    "description": text,
                    "content": {"application/problem+json": {"schema": _ref(shapes.Problem)}},
                }
                for status, text in PROBLEMS.items()
            },
            "securitySchemes": {
                "token": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "An API token (`poller tokens create`): `wpt_…`",
                },
                "operator": {
                    "type": "http",
                    "scheme": "basic",
                    "description": "The dashboard's operator credentials: admin",
                },
            },
        },
    }


def _tag(op: Operation) -> str:
    return op.template.split("/")[3]


def _ref(shape: type) -> dict[str, str]:
    return {"$ref": REF.format(model=shape.__name__)}


def _operation(op: Operation) -> dict[str, Any]:
    spec = op.spec
    doc = inspect.cleandoc(op.handler.__doc__ or "")
    shown: dict[str, Any] = {
        "operationId": op.id,
        "summary": op.summary,
        "tags": [_tag(op)],
    }
    if doc:
        shown["description"] = _markdown(" ".join(doc.split()))
    params = [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
        for name in re.findall(r"\{(\w+)\}", op.template)
    ]
    params += [
        {
            "name": p.name,
            "in": "query",
            "required": False,
            "description": _markdown(p.description),
            "schema": p.schema,
        }
        for p in spec.query
    ]
    if spec.body is not None and op.method == "POST" and "Idempotency-Key" in doc:
        params.append({
            "name": "Idempotency-Key", "in": "header", "required": False,
            "description": "The same request again with this key answers as the first did",
            "schema": {"type": "string", "maxLength": 255},
        })  # fmt: skip
    if params:
        shown["parameters"] = params
    if spec.body is not None:
        shown["requestBody"] = {
            "required": bool(TypeAdapter(spec.body).json_schema().get("required")),
            "content": {"application/json": {"schema": _ref(spec.body)}},
        }
    answers: dict[str, Any] = {
        str(status): {
            "description": shape.__doc__.strip().split("\n")[0]
            if shape.__doc__ and shape.__module__ == shapes.__name__
            else "OK",
            "content": {"application/json": {"schema": _ref(shape)}},
        }
        for status, shape in sorted(spec.answers.items())
    }
    problems = {401, 429, 503, 422}
    if params and any(p["in"] == "path" for p in params):
        problems.add(404)
    if op.method != "GET":
        problems.update(CHANGE_PROBLEMS)
        problems.add(409)
    for status in sorted(problems):
        answers[str(status)] = {"$ref": f"#/components/responses/{status}"}
    shown["responses"] = answers
    return shown


def schemas(used: Iterable[type]) -> dict[str, Any]:
    """Each shape's JSON Schema (2020-12, as OpenAPI 3.1 takes it), by its name."""
    adapters: list[tuple[type, str, TypeAdapter[Any]]] = [
        (shape, "validation", TypeAdapter(shape)) for shape in used
    ]
    _, top = TypeAdapter.json_schemas(adapters, ref_template=REF)  # type: ignore[arg-type]
    found: dict[str, Any] = top.get("$defs", {})
    for name, schema in found.items():
        docs = _field_docs(getattr(shapes, name, None))
        for field, prop in schema.get("properties", {}).items():
            if field in docs and "description" not in prop:
                prop["description"] = docs[field]
        _untitled(schema)
        if "description" in schema:
            schema["description"] = _markdown(schema["description"])
    return dict(sorted(found.items()))


def _untitled(schema: Any) -> None:
    """Drop pydantic's generated titles below a schema's top (``Lookup Url``): noise
    beside the property's name."""
    if not isinstance(schema, dict):
        return
    for prop in schema.get("properties", {}).values():
        if isinstance(prop, dict):
            prop.pop("title", None)
            _untitled(prop)
    for key in ("items", "additionalProperties"):
        _untitled(schema.get(key))
    for key in ("anyOf", "oneOf", "allOf"):
        for item in schema.get(key, []):
            _untitled(item)


def _markdown(text: str) -> str:
    return text.replace("``", "`").replace(":func:", "").replace(":class:", "")


@cache
def _attribute_docs() -> dict[str, dict[str, str]]:
    """The string after each field of each class in poller/web/api/shapes.py."""
    found = attribute_docs(inspect.getsource(shapes))
    return {cls: {k: _markdown(" ".join(v.split())) for k, v in docs.items()}
            for cls, docs in found.items()}  # fmt: skip


def _field_docs(shape: type | None) -> dict[str, str]:
    """The field docs of ``shape`` and of the shapes it extends (nearest first)."""
    docs: dict[str, str] = {}
    for cls in reversed(_bases(shape) if shape is not None else []):
        docs.update(_attribute_docs().get(cls.__name__, {}))
    return docs


def _bases(shape: type) -> list[type]:
    """``shape`` and the shapes module's classes it extends, nearest first."""
    chain = [shape]
    for base in getattr(shape, "__orig_bases__", ()):
        if isinstance(base, type) and base.__module__ == shapes.__name__:
            chain += _bases(base)
    return chain


def text(doc: dict[str, Any]) -> str:
    """The document as the repository keeps it."""
    return json.dumps(doc, indent=2, sort_keys=False, ensure_ascii=False) + "\n"
