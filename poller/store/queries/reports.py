"""Statements that read for people: operational events' details and the queue's figures
(``poller admin stats``, the dashboard's overview and chart).

The operators' reads whose shape depends on what is asked are built with SQLAlchemy Core
below (poller/operate/stats.py runs them).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Select, func, select

from poller.store.queries._registry import statement as _statement
from poller.store.schema import delivery_attempts, endpoint_health, endpoints, event_log, outbox

__all__ = [  # what `queries` offers by name; the builders are this module's
    "ACTIVITY",
    "DELIVERED_COUNTS",
    "EVENT_ENDPOINT_NAMES",
    "FAILED_MESSAGES",
    "OPEN_COUNTS",
    "OUTBOX_ROWS_ESTIMATE",
    "THIS_MINUTE",
]

# Operational events (poller/rows/events.py), in the completion's transaction: names of
# the endpoints a batch of events is about, and the messages that just failed.
EVENT_ENDPOINT_NAMES = _statement(
    "EVENT_ENDPOINT_NAMES",
    "SELECT id, name FROM poller_endpoints WHERE id = ANY(CAST(:ids AS bigint[]))",
)
FAILED_MESSAGES = _statement(
    "FAILED_MESSAGES",
    """
    SELECT o.id, o.endpoint_id, e.name AS endpoint, o.event_type, o.idempotency_key,
           o.attempts, o.last_status_code,
           (SELECT a.error_class FROM poller_delivery_attempts a
            WHERE a.message_id = o.id ORDER BY a.id DESC LIMIT 1) AS error_class
    FROM poller_outbox o JOIN poller_endpoints e ON e.id = o.endpoint_id
    WHERE o.id = ANY(CAST(:ids AS bigint[])) AND o.status = 'failed'
    ORDER BY o.id
    """,
)

# Open rows per endpoint and status, each status from its own partial index (small,
# whatever the history); delivered rows — the history — only when asked (a full scan).
OPEN_COUNTS = _statement(
    "OPEN_COUNTS",
    " UNION ALL ".join(
        f"SELECT endpoint_id, '{status}' AS status, count(*) AS n FROM poller_outbox "
        f"WHERE status = '{status}' GROUP BY endpoint_id"
        for status in ("pending", "in_flight", "waiting", "failed", "cancelled")
    ),
)
DELIVERED_COUNTS = _statement(
    "DELIVERED_COUNTS",
    "SELECT endpoint_id, 'delivered' AS status, count(*) AS n FROM poller_outbox "
    "WHERE status = 'delivered' GROUP BY endpoint_id",
)
OUTBOX_ROWS_ESTIMATE = _statement(
    "OUTBOX_ROWS_ESTIMATE",
    "SELECT reltuples FROM pg_class WHERE oid = CAST('poller_outbox' AS regclass)",
)

# Attempts per minute over the last :n minutes (the BRIN index on finished_at finds
# them), and the minute it is now, by the database's clock.
ACTIVITY = _statement(
    "ACTIVITY",
    """
    SELECT date_trunc('minute', finished_at) AS minute,
           count(*) FILTER (WHERE outcome = 'delivered') AS delivered,
           count(*) FILTER (WHERE outcome <> 'delivered') AS failed
    FROM poller_delivery_attempts
    WHERE finished_at >= date_trunc('minute', now()) - make_interval(mins => :n - 1)
      AND kind IN ('send', 'lookup')
    GROUP BY 1
    """,
)
THIS_MINUTE = _statement("THIS_MINUTE", "SELECT date_trunc('minute', now())")


# --- built with SQLAlchemy Core: their shape depends on what is asked ---------------


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
