"""How outbox rows are written: the kernel under enqueue, publish and replay.

:func:`poller.enqueue` (poller/outbox.py), :func:`poller.publish`
(poller/fanout.py) and replay (poller/replay.py) each check their input
into :class:`NewRow` values and hand them to :func:`insert_rows`, which
places ordered rows behind their keys' heads, inserts them in one statement,
resolves idempotent repeats and conflicts, and wakes the pollers.

The steps are sans I/O: a generator that yields ``(statement, params)`` and
receives the result rows, driven by :func:`drive` on a synchronous connection
or :func:`drive_async` on an asynchronous one, so the sync and async APIs
share one implementation. Nothing here commits.
"""

from __future__ import annotations

import math
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Row, TextClause
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import Session

from poller import queries
from poller.errors import EnqueueError, IdempotencyConflict, IdempotencyKeySpent, NaiveDatetime
from poller.ordering import Positions
from poller.settings import MAX_ATTEMPTS, default_settings
from poller.tracing import trace_params

MAX_DELAY = 100 * 365.25 * 86400.0  # seconds: deliver_after as a timedelta

DeliverAfter = datetime | timedelta | None
SyncConn = Session | Connection
AsyncConn = AsyncSession | AsyncConnection
Steps = Generator[tuple[TextClause, Mapping[str, Any]], list[Row[Any]], Any]


@dataclass(frozen=True, slots=True)
class NewRow:
    """One outbox row to write, checked: what :func:`insert_rows` inserts."""

    endpoint: str
    event_type: str
    payload: str | None  # serialised JSON; None for a published event's row
    idempotency_key: str
    deliver_at: datetime | None
    delay: float
    max_attempts: int | None
    ordering_key: str | None = None
    event_id: int | None = None  # a published event's row (poller/fanout.py): payload is None


def check_schedule(deliver_after: object) -> tuple[datetime | None, float]:
    """``deliver_after`` as (an instant, or None and a delay in seconds from the database's now)."""
    if deliver_after is None:
        return None, 0.0
    if isinstance(deliver_after, datetime):
        if deliver_after.tzinfo is None or deliver_after.utcoffset() is None:
            raise NaiveDatetime(
                "deliver_after must be timezone-aware (e.g. datetime.now(timezone.utc)); "
                "a naive datetime is ambiguous"
            )
        # Either way: the year 9999 overflows; 0001-01-01T00:00+14:00 is stored in 1 BC,
        # which no reader could load back (showing the message was a DataError).
        if abs((deliver_after - datetime.now(UTC)).total_seconds()) > MAX_DELAY:
            raise EnqueueError("deliver_after must be at most 100 years away, either way")
        return deliver_after, 0.0
    if isinstance(deliver_after, timedelta):
        seconds = deliver_after.total_seconds()
        if seconds < 0 or not math.isfinite(seconds):
            raise EnqueueError("deliver_after must not be a negative timedelta")
        if seconds > MAX_DELAY:  # past it, now() + the delay overflows in PostgreSQL
            raise EnqueueError("deliver_after must be at most 100 years away")
        return None, seconds
    kind = type(deliver_after).__name__
    raise EnqueueError(f"deliver_after must be an aware datetime or a timedelta, not {kind}")


def check_max_attempts(max_attempts: object) -> int | None:
    """An attempt budget: None (the endpoint's or the global one) or a positive int."""
    if max_attempts is None:
        return None
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
        raise EnqueueError(f"max_attempts must be a positive integer, not {max_attempts!r}")
    if max_attempts > MAX_ATTEMPTS:  # as an endpoint's and POLLER_MAX_ATTEMPTS
        raise EnqueueError(f"max_attempts must be at most {MAX_ATTEMPTS}, not {max_attempts}")
    return max_attempts


def _place_keyed(unique: Sequence[NewRow], endpoint_ids: Mapping[str, int]) -> Steps:
    """Lock the batch's ordering keys (sorted) and give each keyed message its status
    (poller/ordering.py); (None, [None…]) when none has a key."""
    keyed = [m for m in unique if m.ordering_key is not None]
    if not keyed:
        return None, [None] * len(unique)
    yield queries.LOCK_KEY_NAMES, {"ordering_keys": [m.ordering_key for m in keyed]}
    rows = yield (
        queries.LOCK_ORDERING_KEYS,
        {
            "endpoint_ids": [endpoint_ids[m.endpoint] for m in keyed],
            "ordering_keys": [m.ordering_key for m in keyed],
        },
    )
    positions = Positions(rows)
    statuses = [
        None
        if m.ordering_key is None
        else positions.place(endpoint_ids[m.endpoint], m.ordering_key)
        for m in unique
    ]
    return positions, statuses


def insert_rows(unique: Sequence[NewRow], endpoints: Mapping[str, Row[Any]]) -> Steps:
    """Insert these messages (no two with one (endpoint, key)) to these usable endpoints
    (rows like ENDPOINTS_BY_NAME's, by name); return their ids by index, an existing
    message's id for an idempotent repeat. Ordered ones are placed behind their keys'
    heads; a conflict or a spent key raises (the caller's savepoint undoes the rest)."""
    settings = default_settings()

    def budget(m: NewRow) -> int:
        endpoint_max = endpoints[m.endpoint].max_attempts
        return m.max_attempts or endpoint_max or settings.max_attempts

    positions, statuses = yield from _place_keyed(unique, {n: e.id for n, e in endpoints.items()})
    columns = {
        "endpoint_ids": [endpoints[m.endpoint].id for m in unique],
        "buckets": [endpoints[m.endpoint].bucket for m in unique],
        "event_types": [m.event_type for m in unique],
        "payloads": [m.payload for m in unique],
        "idempotency_keys": [m.idempotency_key for m in unique],
        "max_attempts": [budget(m) for m in unique],
        "deliver_ats": [m.deliver_at for m in unique],
        "delays": [m.delay for m in unique],
        "ordering_keys": [m.ordering_key for m in unique],
        "statuses": statuses,
        "event_ids": [m.event_id for m in unique],
    }
    # A published event's rows read its trace context; an enqueued message keeps its own.
    trace = trace_params(stored=bool(unique) and unique[0].event_id is None)
    inserted = yield queries.ENQUEUE_MANY, {**columns, **trace}
    heads = positions.finish(inserted) if positions is not None else None
    if heads is not None:
        yield queries.SET_ORDERING_HEADS, heads
    ids = {(row.endpoint_id, row.idempotency_key): int(row.id) for row in inserted}
    if len(ids) < len(unique):
        existing = yield queries.ENQUEUE_MANY_EXISTING, columns
        for row in existing:
            if (row.endpoint_id, row.idempotency_key) in ids:
                continue
            if not row.same_content:
                name = next(n for n, e in endpoints.items() if e.id == row.endpoint_id)
                raise IdempotencyConflict(name, row.idempotency_key, row.id)
            ids[(row.endpoint_id, row.idempotency_key)] = int(row.id)
        for m in unique:
            if (endpoints[m.endpoint].id, m.idempotency_key) not in ids:
                raise IdempotencyKeySpent(m.endpoint, m.idempotency_key)
    if inserted and settings.notify:
        buckets = sorted({endpoints[m.endpoint].bucket for m in unique})
        yield queries.NOTIFY_BUCKETS, {"buckets": buckets}
    return [ids[(endpoints[m.endpoint].id, m.idempotency_key)] for m in unique]


def drive(conn: SyncConn, steps: Steps) -> Any:
    """Run ``steps`` on a synchronous connection; return what they return."""
    result: list[Row[Any]] | None = None
    try:
        while True:
            statement, params = steps.send(result)  # type: ignore[arg-type]
            result = list(conn.execute(statement, params).all())
    except StopIteration as done:
        return done.value


async def drive_async(conn: AsyncConn, steps: Steps) -> Any:
    """Run ``steps`` on an asynchronous connection; return what they return."""
    result: list[Row[Any]] | None = None
    try:
        while True:
            statement, params = steps.send(result)  # type: ignore[arg-type]
            result = list((await conn.execute(statement, params)).all())
    except StopIteration as done:
        return done.value
