"""Statements of the operators' reads (poller/operate/stats.py) whose shape depends on
what is asked, built with SQLAlchemy Core; the fixed ones are text statements in
reports.py. Each costs the same with a million rows of history as with none: open
rows are counted from their partial indexes, attempts found through the BRIN index
on ``finished_at``."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Select, func, select

from poller.store.schema import delivery_attempts, endpoint_health, endpoints, event_log, outbox


# The endpoints a count names (their ids from the counts): name, whether enabled, the
# pauses that hold them and their circuit's state — what the overview says of each.
def endpoint_states(endpoint_ids: Iterable[int]) -> Select[Any]:
    return (
        select(
            endpoints.c.id,
            endpoints.c.name,
            endpoints.c.enabled,
            endpoints.c.paused_until,
            endpoints.c.held_until,
            endpoints.c.held_by,
            endpoint_health.c.state,
        )
        .join(endpoint_health, endpoint_health.c.endpoint_id == endpoints.c.id, isouter=True)
        .where(endpoints.c.id.in_(set(endpoint_ids)))
    )


# Seconds the oldest due pending message has waited (NULL: none is due).
OLDEST_DUE = select(func.extract("epoch", func.now() - func.min(outbox.c.next_attempt_at))).where(
    outbox.c.status == "pending", outbox.c.next_attempt_at <= func.now()
)

# Messages failed in the last hour and in the last day.
FAILED_RECENTLY = select(
    func.count().filter(outbox.c.failed_at > func.now() - timedelta(hours=1)),
    func.count().filter(outbox.c.failed_at > func.now() - timedelta(days=1)),
).where(outbox.c.status == "failed")

# Attempts that finished in the last minute.
ATTEMPTS_LAST_MINUTE = select(func.count()).where(
    delivery_attempts.c.finished_at > func.now() - timedelta(minutes=1)
)

# Events published in the last day, and those that reached no endpoint.
EVENTS_LAST_DAY = select(func.count(), func.count().filter(event_log.c.fanned_out == 0)).where(
    event_log.c.created_at > func.now() - timedelta(days=1)
)


# An endpoint's last delivery.
def last_success(endpoint_id: int) -> Select[Any]:
    return select(func.max(outbox.c.delivered_at)).where(outbox.c.endpoint_id == endpoint_id)


# An endpoint's sends that did not deliver since its last delivery (``after``; None: ever).
def failures_since(endpoint_id: int, after: datetime | None) -> Select[Any]:
    sends = (
        select(delivery_attempts.c.id)
        .join(outbox, outbox.c.id == delivery_attempts.c.message_id)
        .where(outbox.c.endpoint_id == endpoint_id, delivery_attempts.c.kind == "send")
    )
    if after is not None:
        sends = sends.where(delivery_attempts.c.finished_at > after)
    failed = sends.where(delivery_attempts.c.outcome != "delivered").subquery()
    return select(func.count()).select_from(failed)


# An endpoint's messages by status.
def endpoint_queue(endpoint_id: int) -> Select[Any]:
    return (
        select(outbox.c.status, func.count())
        .where(outbox.c.endpoint_id == endpoint_id)
        .group_by(outbox.c.status)
    )
