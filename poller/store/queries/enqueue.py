"""Statements of the enqueue API, run inside the application's transaction."""

from __future__ import annotations

from poller.store.queries._registry import statement as _statement

# --- enqueue (inside the application's transaction) --------------------------


# Endpoint facts enqueue_many needs to validate a batch before writing.
ENDPOINTS_BY_NAME = _statement(
    "ENDPOINTS_BY_NAME",
    """
    SELECT name, id, bucket, enabled, disabled_reason, max_attempts
    FROM poller_endpoints
    WHERE name = ANY(CAST(:names AS text[]))
    """,
)


# The messages enqueued after :after (an id), with their endpoint's name: what a
# test's transaction added, read in that transaction (poller/testing.py).
ENQUEUED_AFTER = _statement(
    "ENQUEUED_AFTER",
    """
    SELECT o.id, e.name AS endpoint, o.event_type,
           CAST(coalesce(o.payload, ev.payload) AS text) AS payload, o.idempotency_key
    FROM poller_outbox o JOIN poller_endpoints e ON e.id = o.endpoint_id
    LEFT JOIN poller_events ev ON ev.id = o.event_id
    WHERE o.id > :after
    ORDER BY o.id
    """,
)

# The newest message id (0 when there is none): where a test's recording starts.
LAST_MESSAGE_ID = _statement("LAST_MESSAGE_ID", "SELECT coalesce(max(id), 0) FROM poller_outbox")
