"""Statements that read for people: operational events' details and the queue's figures
(``poller admin stats``, the dashboard's overview and chart)."""

from __future__ import annotations

from poller.store.queries._registry import statement as _statement

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
