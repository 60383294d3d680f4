"""Operator queries and actions behind ``poller admin`` (sync, SQLAlchemy Core).

What failed and why (:func:`list_failed`, :func:`message_detail`), how the
queue is doing (poller/stats.py), sending again (:func:`retry_messages`)
and deleting history (:func:`purge`). Every action is one short transaction
per batch, so a large retry or purge never holds long locks; every manual
retry is recorded as an attempt of kind ``manual`` naming who asked.
"""

from __future__ import annotations

import getpass
import socket
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    BigInteger,
    Connection,
    Engine,
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
from sqlalchemy.dialects.postgresql import insert as pg_insert

from poller.endpoint_checks import MAX_COUNT, could_be_name
from poller.errors import InvalidInput, MessageNotFound, UnknownEndpoint
from poller.names import could_be_event_type
from poller.ordering import requeue_keyed
from poller.parse import ROW_ID_MAX, could_be_row_id
from poller.payloads import stored_payload
from poller.schema import STATUSES, delivery_attempts, endpoints, event_log, outbox
from poller.settings import default_settings

RETRY_BATCH = 1000  # ids per statement of a retry


def actor() -> str:
    """Who is acting, for the attempt record: user@host."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"admin:{user}@{socket.gethostname()}"


def _endpoint_id(conn: Connection, name: str) -> int:
    if not could_be_name(name):
        raise UnknownEndpoint(name)
    found = conn.execute(select(endpoints.c.id).where(endpoints.c.name == name)).scalar()
    if found is None:
        raise UnknownEndpoint(name)
    return int(found)


# --- reading ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FailedFilter:
    """Which failed messages: the CLI's ``failed``/``retry --all-failed`` and the dashboard.

    ``error``: an HTTP status (``503``) matches the last status code; any other text
    is looked for in the last error, case-insensitively."""

    endpoint: str | None = None
    event_type: str | None = None
    error: str | None = None
    since: datetime | None = None
    until: datetime | None = None

    def where(self, conn: Connection) -> list[Any]:
        clauses: list[Any] = [outbox.c.status == "failed"]
        if self.endpoint is not None:
            clauses.append(outbox.c.endpoint_id == _endpoint_id(conn, self.endpoint))
        if self.event_type is not None:
            if not could_be_event_type(self.event_type):
                return [false()]  # a type no message can have (PostgreSQL refuses a NUL)
            clauses.append(outbox.c.event_type == self.event_type)
        if self.error:
            if self.error.isascii() and self.error.isdigit() and len(self.error) == 3:
                clauses.append(outbox.c.last_status_code == int(self.error))
            elif "\x00" in self.error:
                return [false()]  # no stored text holds a NUL
            else:
                clauses.append(outbox.c.last_error.icontains(self.error, autoescape=True))
        if self.since is not None:
            clauses.append(outbox.c.failed_at >= self.since)
        if self.until is not None:
            clauses.append(outbox.c.failed_at < self.until)
        return clauses


def list_failed(
    conn: Connection,
    *,
    endpoint: str | None = None,
    event_type: str | None = None,
    since: datetime | None = None,
    limit: int = 50,
    where: FailedFilter | None = None,
    before: tuple[datetime, int] | None = None,
) -> list[dict[str, Any]]:
    """Failed messages, newest failure first; ``before`` ((failed_at, id) of the last row
    of a page) gives the next page — a keyset, so page 1,000 costs what page 1 does."""
    _check_limit(limit)
    where = where or FailedFilter(endpoint, event_type, since=since)
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
        .where(*where.where(conn))
        .order_by(outbox.c.failed_at.desc(), outbox.c.id.desc())
        .limit(limit)
    )
    if before is not None:
        query = query.where(tuple_(outbox.c.failed_at, outbox.c.id) < tuple_(*before))
    return [dict(row._mapping) for row in conn.execute(query)]


MESSAGE_FIELDS = (
    "id", "event_type", "idempotency_key", "status", "attempts", "max_attempts",
    "next_attempt_at", "last_status_code", "last_error", "created_at", "delivered_at",
    "failed_at", "cancelled_at", "ordering_key", "event_id",
)  # fmt: skip


def list_messages(
    conn: Connection,
    *,
    endpoint: str | None = None,
    status: str | None = None,
    event_type: str | None = None,
    tenant: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    before: int | None = None,
    limit: int = 100,
) -> list[dict[str, Any]]:
    """Messages, newest first (their :data:`MESSAGE_FIELDS` and their endpoint's name,
    never a payload); ``tenant``: only that tenant's endpoints' (None: any endpoint's);
    ``since``/``until``: created in that window; ``before``: the id of the last row of a
    page, for the next one (a keyset)."""
    if status is not None and status not in STATUSES:
        raise InvalidInput(f"status {status[:40]!r}: one of {', '.join(STATUSES)}")
    _check_limit(limit)
    if before is not None and before <= 1:  # no row has an id below 1
        return []
    query = (
        select(*(outbox.c[f] for f in MESSAGE_FIELDS), endpoints.c.name.label("endpoint"))
        .join(endpoints, endpoints.c.id == outbox.c.endpoint_id)
        .order_by(outbox.c.id.desc())
        .limit(limit)
    )
    if endpoint is not None:
        query = query.where(outbox.c.endpoint_id == _endpoint_id(conn, endpoint))
    if status is not None:
        query = query.where(outbox.c.status == status)
    if event_type is not None:
        if not could_be_event_type(event_type):
            return []
        query = query.where(outbox.c.event_type == event_type)
    if tenant is not None:
        query = query.where(endpoints.c.tenant == tenant)
    if since is not None:
        query = query.where(outbox.c.created_at >= since)
    if until is not None:
        query = query.where(outbox.c.created_at < until)
    if before is not None and before <= ROW_ID_MAX:  # past it: every row is before
        query = query.where(outbox.c.id < before)
    return [dict(row._mapping) for row in conn.execute(query)]


def _check_limit(limit: int) -> None:
    if limit < 0:
        raise InvalidInput(f"limit {limit}: a number of rows, 0 or more")


def payload_as_text(table: Table) -> list[Any]:
    """``table``'s columns, its ``payload`` read as its text (for
    :func:`~poller.payloads.stored_payload`), in their order."""
    return [cast(c, Text).label(c.name) if c.name == "payload" else c for c in table.c]


def message_detail(
    conn: Connection,
    message_id: int | None = None,
    *,
    key: str | None = None,
    endpoint: str | None = None,
) -> dict[str, Any]:
    """The message (payload included) and every attempt, oldest first."""
    query = select(*payload_as_text(outbox), endpoints.c.name.label("endpoint")).join(
        endpoints, endpoints.c.id == outbox.c.endpoint_id
    )
    if message_id is not None:
        if not could_be_row_id(message_id):
            raise MessageNotFound(f"no message {message_id}")
        query = query.where(outbox.c.id == message_id)
    elif key is not None and endpoint is not None:
        query = query.where(
            outbox.c.endpoint_id == _endpoint_id(conn, endpoint), outbox.c.idempotency_key == key
        )
    else:
        raise InvalidInput("give a message id, or --key with --endpoint")
    row = conn.execute(query).one_or_none()
    if row is None:
        ident = message_id if message_id is not None else f"{key!r} on {endpoint!r}"
        raise MessageNotFound(f"no message {ident}")
    attempts = conn.execute(
        select(delivery_attempts)
        .where(delivery_attempts.c.message_id == row.id)
        .order_by(delivery_attempts.c.id)
    ).all()
    detail = dict(row._mapping)
    detail.pop("endpoint_id")
    if detail["payload"] is None and row.event_id is not None:  # a published event's row
        detail["payload"] = conn.execute(
            select(cast(event_log.c.payload, Text)).where(event_log.c.id == row.event_id)
        ).scalar()
    detail["payload"] = stored_payload(detail["payload"])
    detail["attempts_log"] = [dict(a._mapping) for a in attempts]
    return detail


# --- acting ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RetryPlan:
    ids: list[int]
    skipped: dict[int, str]  # id -> why it was left alone


def plan_retry(
    conn: Connection,
    ids: list[int] | None = None,
    *,
    all_failed: bool = False,
    endpoint: str | None = None,
    since: datetime | None = None,
    force: bool = False,
    where: FailedFilter | None = None,
) -> RetryPlan:
    """Which messages a retry would send again: failed and cancelled ones (delivered with
    ``force``)."""
    query = select(outbox.c.id, outbox.c.status)
    if ids:
        query = query.where(outbox.c.id.in_([i for i in ids if could_be_row_id(i)]))
    elif all_failed or where is not None:
        query = query.where(*(where or FailedFilter(endpoint, since=since)).where(conn))
    else:
        return RetryPlan([], {})
    rows = dict(conn.execute(query.order_by(outbox.c.id)).all())
    allowed = {"failed", "cancelled", "delivered"} if force else {"failed", "cancelled"}
    skipped = {
        i: f"is {s}"
        + (
            ""
            if s == "delivered" and force
            else " (only failed messages; delivered ones with --force)"
            if s == "delivered"
            else ""
        )
        for i, s in rows.items()
        if s not in allowed
    }
    for missing in set(ids or ()) - set(rows):
        skipped[missing] = "not found"
    return RetryPlan([i for i, s in rows.items() if s in allowed], skipped)


def retry_messages(
    engine: Engine, ids: list[int], *, who: str | None = None, outcome: str = "manual_retry"
) -> int:
    """Back to pending now with a fresh attempt budget; a ``manual`` attempt records who
    (and ``outcome``: ``manual_retry``, or ``replayed`` for poller/replay.py)."""
    who = who or actor()
    default = default_settings().max_attempts
    done = 0
    for start in range(0, len(ids), RETRY_BATCH):
        chunk = ids[start : start + RETRY_BATCH]
        with engine.begin() as conn:
            budget = func.coalesce(
                select(endpoints.c.max_attempts)
                .where(endpoints.c.id == outbox.c.endpoint_id)
                .scalar_subquery(),
                default,
            )
            changed = conn.execute(
                update(outbox)
                .where(
                    outbox.c.id.in_(chunk),
                    outbox.c.status.in_(("failed", "cancelled", "delivered")),
                )
                .values(
                    status="pending",
                    next_attempt_at=func.now(),
                    needs_lookup=False,
                    # bigint, and at most the column's: a budget stored before
                    # POLLER_MAX_ATTEMPTS bounded every door (2**31 - 1) overflowed here
                    max_attempts=func.least(
                        cast(outbox.c.attempts, BigInteger) + budget, MAX_COUNT
                    ),
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
            ).all()
            requeue_keyed(
                conn,
                [(r.id, r.endpoint_id, r.ordering_key) for r in changed if r.ordering_key],
            )
            if changed:
                conn.execute(
                    pg_insert(delivery_attempts),
                    [
                        {
                            "message_id": r.id,
                            "endpoint_id": r.endpoint_id,
                            "attempt": r.attempts,
                            "kind": "manual",
                            "poller_id": who,
                            "outcome": outcome,
                        }
                        for r in changed
                    ],
                )
                for bucket in {r.bucket for r in changed}:
                    conn.execute(select(func.pg_notify("poller_outbox", str(bucket))))
            done += len(changed)
    return done


def purge_counts(
    conn: Connection, delivered_older: timedelta | None, failed_older: timedelta | None
) -> dict[str, int]:
    """How many rows a purge would delete."""
    counts = {}
    for status, column, older in (
        ("delivered", outbox.c.delivered_at, delivered_older),
        ("failed", outbox.c.failed_at, failed_older),
        ("cancelled", outbox.c.cancelled_at, failed_older),  # kept as long as failures
    ):
        if older is not None:
            counts[status] = conn.execute(
                select(func.count()).where(
                    and_(outbox.c.status == status, column < func.now() - older)
                )
            ).scalar_one()
    return counts
