"""Statements of the endpoint registry (poller/endpoints/registry.py, keys.py) whose shape
depends on the fields given, built with SQLAlchemy Core; the fixed ones are text
statements in endpoints.py."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from sqlalchemy import ColumnElement, Select, Update, func, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.sql.dml import ReturningInsert, ReturningUpdate

from poller.store.schema import endpoints, outbox


# A transaction-level advisory lock on one tenant (``space``: the registry's lock space),
# held till the end: two makes for that tenant cannot both pass its count. Nothing on
# the claim, completion or publish path takes it.
def lock_tenant(space: int, tenant: str) -> Select[Any]:
    return select(func.pg_advisory_xact_lock(space, func.hashtext(tenant)))


# How many endpoints a tenant has.
def tenant_endpoints(tenant: str) -> Select[Any]:
    return select(func.count()).select_from(endpoints).where(endpoints.c.tenant == tenant)


# Make an endpoint (``values``: its checked, sealed columns): the whole row back.
def create(values: dict[str, Any]) -> ReturningInsert[Any]:
    return insert(endpoints).values(**values).returning(endpoints)


# One endpoint's row, by name.
def by_name(name: str) -> Select[Any]:
    return select(endpoints).where(endpoints.c.name == name)


# The endpoints by name in code-point order (COLLATE "C"), or one tenant's (by
# ix_poller_endpoints_tenant; "" is no tenant), those named after ``after``, at most
# ``limit``: chosen by PostgreSQL, so a page opens the secrets of that page alone.
def page(tenant: str | None, after: str | None, limit: int | None) -> Select[Any]:
    by_name = endpoints.c.name.collate("C")
    query = select(endpoints).order_by(by_name)
    if tenant is not None:
        query = query.where(func.coalesce(endpoints.c.tenant, "") == tenant)
    if after is not None:
        query = query.where(by_name > after)
    if limit is not None:
        query = query.limit(limit)
    return query


# Change one endpoint's columns (``values``: checked, sealed; an expression may name
# the row's columns), by name: the whole row back, none when there is no such name.
def change(name: str, values: dict[str, Any]) -> ReturningUpdate[Any]:
    return (
        update(endpoints)
        .values(**values, updated_at=func.now())
        .where(endpoints.c.name == name)
        .returning(endpoints)
    )


# A new signing key: the current one kept as the previous, valid for ``keep_old_for``.
def rotated_key(sealed: str, keep_old_for: timedelta) -> dict[str, ColumnElement[Any] | str]:
    return {
        "previous_secret": endpoints.c.secret,
        "secret": sealed,
        "previous_secret_expires_at": func.now() + keep_old_for,
    }


# How many messages an endpoint has (a removal without force refuses one that has any).
def messages_of(endpoint_id: int) -> Select[Any]:
    return select(func.count()).where(outbox.c.endpoint_id == endpoint_id)


# Every endpoint's sealed columns, locked (resealing them all, in one transaction).
def sealed_columns(columns: Sequence[str]) -> Select[Any]:
    return (
        select(endpoints.c.id, endpoints.c.name, *(endpoints.c[c] for c in columns))
        .order_by(endpoints.c.id)
        .with_for_update()
    )


# One endpoint's sealed columns, resealed (by id).
def reseal(endpoint_id: int, values: dict[str, Any]) -> Update:
    return update(endpoints).where(endpoints.c.id == endpoint_id).values(**values)
