"""The event-type catalog: what each published event type is, and what its payloads
must look like.

An entry has a name (an event type, as ``publish`` takes it), a description, an
optional **JSON Schema** (2020-12) with an example that matches it, and a deprecated
flag. When a type has a schema, :func:`poller.publish` (and the API's
``POST /api/v1/events``) refuse a payload that does not match it
(:class:`~poller.errors.PayloadInvalid`): nothing is published, so a typo'd field
never reaches a customer. Messages enqueued to a named endpoint are not checked: the
catalog is the publisher's contract with subscribers.

**Cost.** The check rides on the publish's own statement (it reads the type's schema
back), so a type without one costs nothing more; a schema is compiled once per
process and kept (:func:`_validator`, the :data:`COMPILED` most recent).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Row, delete, func, select
from sqlalchemy.dialects.postgresql import insert

from poller.errors import EventTypeNotFound, InvalidInput, PayloadInvalid
from poller.names import check_event_type
from poller.schema_api import event_types as T

COMPILED = 256  # schemas kept compiled
MAX_SCHEMA_BYTES = 64 * 1024
MAX_EXAMPLE_BYTES = 256 * 1024  # a payload, as POLLER_MAX_PAYLOAD_BYTES' default
ERRORS_SHOWN = 5


@dataclass(frozen=True, slots=True)
class EventType:
    name: str
    description: str
    schema: dict[str, Any] | None
    example: Any
    deprecated: bool
    created_at: datetime
    updated_at: datetime

    def public(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "schema": self.schema,
            "example": self.example,
            "deprecated": self.deprecated,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
        }


def _entry(row: Row[Any]) -> EventType:
    return EventType(row.name, row.description, row.schema, row.example, row.deprecated,
                     row.created_at, row.updated_at)  # fmt: skip


@functools.lru_cache(maxsize=COMPILED)
def _validator(schema_text: str) -> Any:
    """The schema (its JSON text, the cache's key), checked and compiled."""
    from jsonschema import Draft202012Validator  # type: ignore[import-untyped]
    from jsonschema.exceptions import SchemaError  # type: ignore[import-untyped]

    schema = json.loads(schema_text)
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        raise InvalidInput(f"schema is not a JSON Schema: {exc.message[:300]}") from None
    _check_refs(schema)
    return Draft202012Validator(schema)


def _check_refs(schema: dict[str, Any]) -> None:
    """Every ``$ref`` points inside the schema, at something there (a pointer or an
    ``$anchor``), looked up as jsonschema will. Nothing is fetched (jsonschema follows
    no URL), so any other one failed every payload's check with jsonschema's own error:
    each publish of the type raised an untyped exception."""
    refs = list(_refs(schema))
    if not refs:
        return
    from referencing import Registry
    from referencing.exceptions import Unresolvable
    from referencing.jsonschema import DRAFT202012

    uri = "urn:webhook-poller:schema"
    resolver = (
        Registry().with_resource(uri, DRAFT202012.create_resource(schema)).crawl()
    ).resolver(base_uri=uri)
    for key, ref in refs:
        if not ref.startswith("#"):
            raise InvalidInput(
                f"schema: {key} {ref[:100]!r} points outside the schema; only "
                "references inside it (like #/$defs/name) can be followed"
            )
        try:
            resolver.lookup(ref)
        except Unresolvable:
            raise InvalidInput(f"schema: {key} {ref[:100]!r} points at nothing in it") from None


def _refs(node: Any) -> Iterator[tuple[str, str]]:
    """Each ``$ref`` and ``$dynamicRef`` in the schema: (keyword, reference)."""
    if isinstance(node, list):
        for item in node:
            yield from _refs(item)
    elif isinstance(node, dict):
        for key, value in node.items():
            if key in ("$ref", "$dynamicRef") and isinstance(value, str):
                yield key, value
            else:
                yield from _refs(value)


def problems(schema: dict[str, Any] | str, payload: Any) -> list[str]:
    """Where and why ``payload`` does not match ``schema`` (the first few); none: it does."""
    from referencing.exceptions import Unresolvable  # jsonschema's, imported with it

    text = schema if isinstance(schema, str) else json.dumps(schema, sort_keys=True)
    validator = _validator(text)
    try:
        errors = list(validator.iter_errors(payload))
    except Unresolvable as exc:  # stored before references were checked (_check_refs)
        raise InvalidInput(f"the schema cannot be followed: {str(exc)[:200]}") from None
    except RecursionError:  # {"$ref": "#"}: its references go round without end
        raise InvalidInput(
            "the schema cannot be followed: its references go round without end"
        ) from None
    found = []
    for error in sorted(errors, key=lambda e: list(e.path))[:ERRORS_SHOWN]:
        where = "/" + "/".join(str(p) for p in error.path)
        found.append(f"{where}: {error.message[:200]}")
    return found


def check_payload(event_type: str, schema: dict[str, Any] | str, payload_json: str) -> None:
    """Raise :class:`PayloadInvalid` unless the payload (JSON text) matches ``schema``,
    also when the stored schema itself cannot be followed (nothing can match it then)."""
    try:
        found = problems(schema, json.loads(payload_json))
    except InvalidInput as exc:
        said = f"the schema of {event_type!r} cannot check it: {exc}"
        raise PayloadInvalid(f"payload refused: {said}", [said]) from None
    if found:
        raise PayloadInvalid(
            f"payload does not match the schema of {event_type!r}: {'; '.join(found)}", found
        )


def _json_text(value: Any, what: str, limit: int = MAX_SCHEMA_BYTES) -> str:
    """``value`` as the JSON text PostgreSQL will store, or InvalidInput naming ``what``:
    JSON types only (no NaN or Infinity), no NUL, at most ``limit`` bytes."""
    try:
        text = json.dumps(value, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidInput(f"{what}: not JSON ({str(exc)[:120]})") from None
    if len(text) > limit or "\\u0000" in text:
        raise InvalidInput(f"{what}: at most {limit:,} bytes of JSON, and no NUL")
    return text


def define_event_type(
    conn: Connection,
    name: str,
    *,
    description: str = "",
    schema: dict[str, Any] | None = None,
    example: Any = None,
    deprecated: bool = False,
) -> EventType:
    """Add an event type to the catalog, or replace its entry. ``schema``: a JSON Schema
    its payloads must match from now on; ``example``: a payload that matches it."""
    name = check_event_type(name)
    if not isinstance(description, str) or len(description) > 2000 or "\x00" in description:
        raise InvalidInput("description: text of at most 2,000 characters")
    if schema is not None:
        if not isinstance(schema, dict):
            raise InvalidInput("schema: a JSON Schema is an object")
        text = _json_text(schema, "schema")
        problems(text, {})  # compiled, and followed once: a schema that loops is refused
        if example is not None and (found := problems(text, example)):
            raise InvalidInput(f"example does not match the schema: {'; '.join(found)}")
    if example is not None:
        _json_text(example, "example", MAX_EXAMPLE_BYTES)
    if not isinstance(deprecated, bool):
        raise InvalidInput(f"deprecated: True or False, not {type(deprecated).__name__}")
    values = {"description": description, "schema": schema, "example": example,
              "deprecated": deprecated}  # fmt: skip
    row = conn.execute(
        insert(T)
        .values(name=name, **values)
        .on_conflict_do_update(index_elements=[T.c.name], set_={**values, "updated_at": func.now()})
        .returning(*T.c)
    ).one()
    return _entry(row)


def get_event_type(conn: Connection, name: str) -> EventType:
    row = (
        conn.execute(select(T).where(T.c.name == name)).one_or_none()
        if "\x00" not in name
        else None
    )
    if row is None:
        raise EventTypeNotFound(f"no event type {name[:200]!r} in the catalog")
    return _entry(row)


def list_event_types(conn: Connection) -> list[EventType]:
    return [_entry(row) for row in conn.execute(select(T).order_by(T.c.name))]


def remove_event_type(conn: Connection, name: str) -> None:
    """Take it out of the catalog: its payloads are no longer checked."""
    get_event_type(conn, name)
    conn.execute(delete(T).where(T.c.name == name))
