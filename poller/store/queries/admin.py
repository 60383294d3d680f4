"""Statements behind ``poller admin`` (poller/operate/admin.py), the dashboard's and the
API's lists of messages, whose shape depends on the filters asked for: built with
SQLAlchemy Core here, and nowhere else. Pages are keysets (``before``: the last row
of the previous page), so page 1,000 costs what page 1 does."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Select,
    Table,
    Text,
    and_,
    cast,
    false,
    func,
    select,
    tuple_,
    update,
)
from sqlalchemy.dialects.postgresql import Insert
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.sql.dml import ReturningUpdate

from poller.store.schema import delivery_attempts, endpoints, event_log, outbox

MESSAGE_FIELDS = (
    "id", "event_type", "idempotency_key", "status", "attempts", "max_attempts",
    "next_attempt_at", "last_status_code", "last_error", "created_at", "delivered_at",
    "failed_at", "cancelled_at", "ordering_key", "event_id",
)  # fmt: skip
"""What a list of messages shows of each (never a payload)."""


def payload_as_text(table: Table) -> list[Any]:
    """``table``'s columns, its ``payload`` read as its text (for
    :func:`~poller.rules.payloads.stored_payload`), in their order."""
    return [cast(c, Text).label(c.name) if c.name == "payload" else c for c in table.c]


# Which failed messages (the CLI's ``failed`` / ``retry --all-failed``, the dashboard):
# an endpoint's, an event type's, whose last error is an HTTP status (three digits) or
# holds some text (case-insensitively, as written), failed within a window. A value no
# row can hold (a NUL) matches nothing without reaching PostgreSQL, which refuses it.
def failed_where(
    *,
    endpoint_id: int | None = None,
    event_type: str | None = None,
    error: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    possible: bool = True,
) -> list[ColumnElement[bool]]:
    if not possible:
        return [false()]
    clauses: list[ColumnElement[bool]] = [outbox.c.status == "failed"]
    if endpoint_id is not None:
        clauses.append(outbox.c.endpoint_id == endpoint_id)
    if event_type is not None:
        clauses.append(outbox.c.event_type == event_type)
    if error:
        if error.isascii() and error.isdigit() and len(error) == 3:
            clauses.append(outbox.c.last_status_code == int(error))
        elif "\x00" in error:
            return [false()]
        else:
            clauses.append(outbox.c.last_error.icontains(error, autoescape=True))
    if since is not None:
        clauses.append(outbox.c.failed_at >= since)
    if until is not None:
        clauses.append(outbox.c.failed_at < until)
    return clauses


# A page of failed messages, newest failure first, with their endpoint's name.
def failed_page(
    where: Sequence[ColumnElement[bool]], limit: int, before: tuple[datetime, int] | None
) -> Select[Any]:
    query = (
        select(
            outbox.c.id,
            endpoints.c.name.label("endpoint"),
            outbox.c.event_type,
            outbox.c.idempotency_key,
            outbox.c.attempts,
            outbox.c.max_attempts,
            outbox.c.last_status_code,
            outbox.c.last_error,
            outbox.c.failed_at,
        )
        .join(endpoints, endpoints.c.id == outbox.c.endpoint_id)
        .where(*where)
        .order_by(outbox.c.failed_at.desc(), outbox.c.id.desc())
        .limit(limit)
    )
    if before is not None:
        query = query.where(tuple_(outbox.c.failed_at, outbox.c.id) < tuple_(*before))
    return query


# A page of messages, newest first, their MESSAGE_FIELDS and their endpoint's name:
# an endpoint's, in a status, of an event type, a tenant's, created in a window.
def messages_page(
    *,
    endpoint_id: int | None,
    status: str | None,
    event_type: str | None,
    tenant: str | None,
    since: datetime | None,
    until: datetime | None,
    before: int | None,
    limit: int,
) -> Select[Any]:
    query = (
        select(*(outbox.c[f] for f in MESSAGE_FIELDS), endpoints.c.name.label("endpoint"))
        .join(endpoints, endpoints.c.id == outbox.c.endpoint_id)
        .order_by(outbox.c.id.desc())
        .limit(limit)
    )
    if endpoint_id is not None:
        query = query.where(outbox.c.endpoint_id == endpoint_id)
    if status is not None:
        query = query.where(outbox.c.status == status)
    if event_type is not None:
        query = query.where(outbox.c.event_type == event_type)
    if tenant is not None:
        query = query.where(endpoints.c.tenant == tenant)
    if since is not None:
        query = query.where(outbox.c.created_at >= since)
    if until is not None:
        query = query.where(outbox.c.created_at < until)
    if before is not None:
        query = query.where(outbox.c.id < before)
    return query


# One message, payload as text, with its endpoint's name: by id, or by its endpoint
# and idempotency key.
def message(
    message_id: int | None = None, *, endpoint_id: int | None = None, key: str | None = None
) -> Select[Any]:
    query = select(*payload_as_text(outbox), endpoints.c.name.label("endpoint")).join(
        endpoints, endpoints.c.id == outbox.c.endpoint_id
    )
    if message_id is not None:
        return query.where(outbox.c.id == message_id)
    return query.where(outbox.c.endpoint_id == endpoint_id, outbox.c.idempotency_key == key)


# A message's attempts, oldest first.
def attempts(message_id: int) -> Select[Any]:
    return (
        select(delivery_attempts)
        .where(delivery_attempts.c.message_id == message_id)
        .order_by(delivery_attempts.c.id)
    )


# A published event's payload, as its text.
def event_payload(event_id: int) -> Select[Any]:
    return select(cast(event_log.c.payload, Text)).where(event_log.c.id == event_id)


# A published event, payload as text (a replay's).
def event(event_id: int) -> Select[Any]:
    return select(*payload_as_text(event_log)).where(event_log.c.id == event_id)


# The id and status of messages, by id or by a filter (failed_where), in id order.
def statuses(
    ids: Sequence[int] | None = None, where: Sequence[ColumnElement[bool]] = ()
) -> Select[Any]:
    query = select(outbox.c.id, outbox.c.status)
    if ids is not None:
        query = query.where(outbox.c.id.in_(ids))
    return query.where(*where).order_by(outbox.c.id)


# A manual retry of one batch: failed, cancelled or delivered messages back to pending
# now, with a fresh attempt budget on top of the attempts made (the endpoint's, else
# ``default``) — bigint, and at most ``most``: a budget stored before
# POLLER_MAX_ATTEMPTS bounded every door (2**31 - 1) overflowed here. Returns what the
# attempt records, ordering keys and wake-ups need.
def retry(ids: Sequence[int], default: int, most: int) -> ReturningUpdate[Any]:
    budget = func.coalesce(
        select(endpoints.c.max_attempts)
        .where(endpoints.c.id == outbox.c.endpoint_id)
        .scalar_subquery(),
        default,
    )
    return (
        update(outbox)
        .where(outbox.c.id.in_(ids), outbox.c.status.in_(("failed", "cancelled", "delivered")))
        .values(
            status="pending",
            next_attempt_at=func.now(),
            needs_lookup=False,
            max_attempts=func.least(cast(outbox.c.attempts, BigInteger) + budget, most),
            failed_at=None,
            delivered_at=None,
            cancelled_at=None,
            claim_expires_at=None,
            updated_at=func.now(),
        )
        .returning(
            outbox.c.id,
            outbox.c.attempts,
            outbox.c.bucket,
            outbox.c.endpoint_id,
            outbox.c.ordering_key,
        )
    )


# Attempt records (executemany with one dict a row): a manual retry's, a replay's.
RECORD_ATTEMPTS: Insert = pg_insert(delivery_attempts)


# Wake the pollers watching a bucket (LISTEN poller_outbox).
def wake(bucket: int) -> Select[Any]:
    return select(func.pg_notify("poller_outbox", str(bucket)))


# How many messages in ``status`` ended (``column``) longer than ``older`` ago.
def ended_before(status: str, older: timedelta) -> Select[Any]:
    column = {
        "delivered": outbox.c.delivered_at,
        "failed": outbox.c.failed_at,
        "cancelled": outbox.c.cancelled_at,
    }[status]
    return select(func.count()).where(and_(outbox.c.status == status, column < func.now() - older))
