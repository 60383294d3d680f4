"""Statements of the event-type catalog (poller/outbox/catalog.py), built with SQLAlchemy
Core: the catalog is small and read by name."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Delete, Select, delete, func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.sql.dml import ReturningInsert

from poller.store.schema_api import event_types as T


# Define an event type, or replace what it says (description, schema, example,
# deprecated): the whole entry back.
def define(name: str, values: dict[str, Any]) -> ReturningInsert[Any]:
    return (
        insert(T)
        .values(name=name, **values)
        .on_conflict_do_update(index_elements=[T.c.name], set_={**values, "updated_at": func.now()})
        .returning(*T.c)
    )


# One event type, by name.
def entry(name: str) -> Select[Any]:
    return select(T).where(T.c.name == name)


# The catalog in name order: all of it, or a page of ``limit`` after the name ``after``.
def page(after: str | None, limit: int | None) -> Select[Any]:
    query = select(T).order_by(T.c.name)
    if after is not None:
        query = query.where(T.c.name > after)
    if limit is not None:
        query = query.limit(limit)
    return query


# Take an event type out of the catalog.
def remove(name: str) -> Delete:
    return delete(T).where(T.c.name == name)
