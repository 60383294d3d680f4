"""The event-type catalog: what each published event type is, and what its payloads
must look like.

An entry has a name (an event type, as ``publish`` takes it), a description, an
optional **JSON Schema** (2020-12) with an example that matches it, and a deprecated
flag. When a type has a schema, :func:`poller.publish` (and the API's
``POST /api/v1/events``) refuse a payload that does not match it
(:class:`~poller.errors.PayloadInvalid`): nothing is published, so a typo'd field
never reaches a customer. Messages enqueued to a named endpoint are not checked: the
catalog is the publisher's contract with subscribers.

How a payload is checked against a schema, at a cost that grows with the payload (a
linear-time regex engine, a limit on the check's steps): poller/outbox/json_schemas.py.

**Cost.** The check rides on the publish's own statement (it reads the type's schema
back), so a type without one costs nothing more; a schema is compiled once per
process and kept.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Row

from poller.errors import EventTypeNotFound, InvalidInput, PayloadInvalid
from poller.outbox.json_schemas import problems
from poller.rules.names import check_event_type, could_be_event_type
from poller.rules.payloads import MAX_DEPTH, nesting
from poller.store.queries import catalog as built

MAX_SCHEMA_BYTES = 64 * 1024
MAX_EXAMPLE_BYTES = 256 * 1024  # a payload, as POLLER_MAX_PAYLOAD_BYTES' default


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


def check_payload(event_type: str, schema: dict[str, Any] | str, payload_json: str) -> None:
    """Raise :class:`PayloadInvalid` unless the payload (JSON text) matches ``schema``,
    also when the stored schema itself cannot be followed (nothing can match it then)."""
    try:
        found = problems(schema, json.loads(payload_json), stored=True)
    except InvalidInput as exc:
        said = f"the schema of {event_type!r} cannot check it: {exc}"
        raise PayloadInvalid(f"payload refused: {said}", [said]) from None
    if found:
        raise PayloadInvalid(
            f"payload does not match the schema of {event_type!r}: {'; '.join(found)}", found
        )


def _json_text(value: Any, what: str, limit: int = MAX_SCHEMA_BYTES) -> str:
    """``value`` as the JSON text PostgreSQL will store, or InvalidInput naming ``what``:
    JSON types only (no NaN or Infinity), no NUL or lone surrogate (jsonb refuses both),
    at most ``limit`` bytes and :data:`~poller.rules.payloads.MAX_DEPTH` levels deep."""
    try:
        text = json.dumps(value, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidInput(f"{what}: not JSON ({str(exc)[:120]})") from None
    if len(text) > limit or "\\u0000" in text:
        raise InvalidInput(f"{what}: at most {limit:,} bytes of JSON, and no NUL")
    if (depth := nesting(text)) > MAX_DEPTH:  # the API's views of it failed past ~600
        raise InvalidInput(f"{what}: nests {depth} levels deep; at most {MAX_DEPTH}")
    if "\\ud" in text and not _utf8(json.dumps(value, ensure_ascii=False)):  # pairs are fine
        raise InvalidInput(f"{what}: a lone surrogate (\\ud800-\\udfff) is not text")
    return text


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


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
    if (
        not isinstance(description, str)
        or len(description) > 2000
        or "\x00" in description
        or not _utf8(description)
    ):
        raise InvalidInput(
            "description: text of at most 2,000 characters, no NUL or lone surrogate"
        )
    if example is not None:
        _json_text(example, "example", MAX_EXAMPLE_BYTES)
    if schema is not None:
        if not isinstance(schema, dict):
            raise InvalidInput("schema: a JSON Schema is an object")
        text = _json_text(schema, "schema")
        problems(text, {})  # compiled, and followed once: a schema that loops is refused
        if example is not None and (found := problems(text, example)):
            raise InvalidInput(f"example does not match the schema: {'; '.join(found)}")
    if not isinstance(deprecated, bool):
        raise InvalidInput(f"deprecated: True or False, not {type(deprecated).__name__}")
    values = {"description": description, "schema": schema, "example": example,
              "deprecated": deprecated}  # fmt: skip
    row = conn.execute(built.define(name, values)).one()
    return _entry(row)


def get_event_type(conn: Connection, name: str) -> EventType:
    row = conn.execute(built.entry(name)).one_or_none() if "\x00" not in name else None
    if row is None:
        raise EventTypeNotFound(f"no event type {name[:200]!r} in the catalog")
    return _entry(row)


def list_event_types(
    conn: Connection, *, after: str | None = None, limit: int | None = None
) -> list[EventType]:
    """The catalog in name order: all of it, or a page of ``limit`` after the name ``after``
    (InvalidInput if no event type can have that name: a NUL reached PostgreSQL)."""
    if after is not None and not could_be_event_type(after):
        raise InvalidInput(f"after {after[:40]!r}: not an event type's name")
    return [_entry(row) for row in conn.execute(built.page(after, limit))]


def remove_event_type(conn: Connection, name: str) -> None:
    """Take it out of the catalog: its payloads are no longer checked."""
    get_event_type(conn, name)
    conn.execute(built.remove(name))
