"""Statements of the endpoint registry (poller/endpoints/registry.py).

Statements whose shape depends on the fields given (a page of endpoints, an update of
the fields changed) are built with SQLAlchemy Core below, one function each.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from sqlalchemy import ColumnElement, Select, Update, func, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.sql.dml import ReturningInsert, ReturningUpdate

from poller.store.queries._registry import statement as _statement
from poller.store.schema import endpoints, outbox

__all__ = [  # what `queries` offers by name; the builders are this module's
    "DELETE_EMPTY_ENDPOINT",
    "DELETE_UNCLAIMED_MESSAGES",
    "ENDPOINTS_SHOWN",
    "ENDPOINT_ID",
    "EVERY_ENDPOINT",
    "START_REMOVAL",
]

# Removing an endpoint with its messages, step 1: it takes no new message (enqueue
# and publish refuse or pass a disabled endpoint, its subscriptions are dropped), and
# the pollers stop claiming its rows. Returns its id, NULL-free.
START_REMOVAL = _statement(
    "START_REMOVAL",
    """
    UPDATE poller_endpoints
    SET enabled = false, disabled_reason = 'being removed', event_types = '{}',
        updated_at = now()
    WHERE id = :endpoint_id
    RETURNING id
    """,
)

# Removing an endpoint, step 2 (repeated): delete its messages that no live claim
# holds — every one not in flight, and those whose claim expired (a late outcome
# from that claim is fenced out) — but never one in flight under a live claim (its
# poller is sending it: it ends as its attempt says, and is deleted then). SKIP
# LOCKED: a row a poller is claiming this instant, or one another transaction holds,
# is left for the next round, so neither the claim path nor anyone else waits on a
# removal, and a removal waits on nobody. Returns how many it deleted, and how many
# of the endpoint's messages remain.
DELETE_UNCLAIMED_MESSAGES = _statement(
    "DELETE_UNCLAIMED_MESSAGES",
    """
    WITH unclaimed AS (
        SELECT id FROM poller_outbox
        WHERE endpoint_id = :endpoint_id
          AND (status <> 'in_flight' OR claim_expires_at < now())
        FOR UPDATE SKIP LOCKED
    ), deleted AS (
        DELETE FROM poller_outbox WHERE id = ANY(ARRAY(SELECT id FROM unclaimed))
        RETURNING id
    )
    SELECT (SELECT count(*) FROM deleted) AS deleted,
           (SELECT count(*) FROM poller_outbox WHERE endpoint_id = :endpoint_id)
               - (SELECT count(*) FROM deleted) AS remaining,
           (SELECT extract(epoch FROM max(claim_expires_at) - now()) FROM poller_outbox
            WHERE endpoint_id = :endpoint_id AND status = 'in_flight') AS lease_left
    """,
)

# Removing an endpoint, last step: once it has no message left (its health, keys and
# credentials go with it: ON DELETE CASCADE). SKIP LOCKED: an application's enqueue
# that read the endpoint before it was disabled holds its row (the foreign key's
# check) until it commits; the removal tries again rather than wait, and an insert
# that committed meanwhile fails this statement's foreign key check (RESTRICT) and
# is deleted by the next round. Returns its id when it was deleted.
DELETE_EMPTY_ENDPOINT = _statement(
    "DELETE_EMPTY_ENDPOINT",
    """
    DELETE FROM poller_endpoints e
    WHERE e.id = (SELECT id FROM poller_endpoints WHERE id = :endpoint_id
                  FOR UPDATE SKIP LOCKED)
      AND NOT EXISTS (SELECT 1 FROM poller_outbox o WHERE o.endpoint_id = e.id)
    RETURNING e.id
    """,
)

# Every endpoint, whole, by name: `poller run` opens each one's signing secret before
# it starts (poller/service/runner.py), so a wrong POLLER_SECRETS_KEY stops it at once.
EVERY_ENDPOINT = _statement("EVERY_ENDPOINT", "SELECT * FROM poller_endpoints ORDER BY name")

# An endpoint's id by name, or no row: POLLER_OPERATOR_ENDPOINT must name one.
ENDPOINT_ID = _statement("ENDPOINT_ID", "SELECT id FROM poller_endpoints WHERE name = :name")

# What the dashboard's endpoint list shows beside their health (stats.health_report):
# where each goes and what it takes — never a secret.
ENDPOINTS_SHOWN = _statement(
    "ENDPOINTS_SHOWN",
    """
    SELECT name, url, event_types, tenant FROM poller_endpoints
    WHERE name = ANY(CAST(:names AS text[]))
    """,
)


# --- built with SQLAlchemy Core: their shape depends on what is asked ---------------


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
