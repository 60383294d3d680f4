"""What a row to write into the outbox is, checked: the checks enqueue, publish and
replay share before the database's functions write it (poller/outbox/doors.py,
db/sql/0026_doors.sql), which check the same again for every door."""

from __future__ import annotations

import math
from collections.abc import Generator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Row, TextClause
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import Session

from poller.errors import EnqueueError, NaiveDatetime
from poller.settings import MAX_ATTEMPTS

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
    event_id: int | None = (
        None  # a published event's row (poller/outbox/publish.py): payload is None
    )


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
