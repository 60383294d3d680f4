"""Statements of fan-out (poller/outbox/publish.py): publish, and replay to one endpoint."""

from __future__ import annotations

from poller.store.queries._registry import statement as _statement


def patterns(event_type: str) -> str:
    """SQL: the subscription patterns that take ``event_type``: the type itself and each
    of its prefixes followed by ``*`` (``*``, ``i*``, … ``invoice.*``, … ``invoice.paid*``)
    — at most 257 of them."""
    return f"""(ARRAY(SELECT left({event_type}, k) || '*'
                FROM generate_series(0, char_length({event_type})) AS k) || {event_type})"""


def reaches(e: str, matching: str, payload: str, tenant: str) -> str:
    """SQL: endpoint ``e`` is subscribed to an event in ``tenant`` (both none counts)
    whose type the ``matching`` patterns (:func:`patterns`) take, with ``payload``
    (jsonb) containing its payload filter, if it has one. Enabled or not is the
    caller's business (replay asks for neither). The pattern match is an array
    overlap (``&&``), which the GIN index on ``event_types`` answers."""
    return f"""coalesce({e}.tenant, '') = coalesce({tenant}, '')
          AND {e}.event_types && {matching}
          AND ({e}.payload_filter IS NULL OR {payload} @> {e}.payload_filter)"""


# --- operators ------------------------------------------------------------------

# An event and every delivery of it (poller admin show --event).
EVENT_DELIVERIES = _statement(
    "EVENT_DELIVERIES",
    """
    SELECT o.id, e.name AS endpoint, o.status, o.attempts, o.max_attempts,
           o.last_status_code, o.last_error, o.created_at, o.delivered_at, o.failed_at
    FROM poller_outbox o JOIN poller_endpoints e ON e.id = o.endpoint_id
    WHERE o.event_id = :event_id
    ORDER BY e.name
    """,
)

# Replay, one batch: the next events (after the cursor (created_at, id), before
# :until) that the endpoint is subscribed to now, oldest first, with its row for the
# event's key if it has one. Read through ix_poller_events_created_at; a batch is
# :limit events.
REPLAY_BATCH = _statement(
    "REPLAY_BATCH",
    f"""
    SELECT ev.id, ev.created_at, ev.event_type, ev.idempotency_key, ev.ordering_key,
           o.id AS message_id, o.status, o.event_id AS message_event_id
    FROM poller_events ev
    JOIN poller_endpoints e ON e.id = :endpoint_id
    LEFT JOIN poller_outbox o ON o.endpoint_id = e.id AND o.idempotency_key = ev.idempotency_key
    WHERE (ev.created_at, ev.id) > (CAST(:after_at AS timestamptz), CAST(:after_id AS bigint))
      AND ev.created_at < CAST(:until AS timestamptz)
      AND (CAST(:event_type AS text) IS NULL OR ev.event_type = CAST(:event_type AS text))
      AND (CAST(:event_id AS bigint) IS NULL OR ev.id = CAST(:event_id AS bigint))
      AND {reaches("e", patterns("ev.event_type"), "CAST(ev.payload AS jsonb)", "ev.tenant")}
    ORDER BY ev.created_at, ev.id
    LIMIT :limit
    """,
)

# Replay: an operator's replay delivers again even a key retention had spent.
UNSPEND_KEYS = _statement(
    "UNSPEND_KEYS",
    """
    DELETE FROM poller_spent_keys
    WHERE endpoint_id = :endpoint_id AND idempotency_key = ANY(CAST(:keys AS text[]))
    RETURNING idempotency_key
    """,
)

# Retention: events older than :age seconds that no row references any more (their
# deliveries were purged, or they reached no endpoint), in small batches.
PURGE_EVENTS = _statement(
    "PURGE_EVENTS",
    """
    WITH gone AS (
        DELETE FROM poller_events WHERE id IN (
            SELECT ev.id FROM poller_events ev
            WHERE ev.created_at < now() - make_interval(secs => CAST(:age AS double precision))
              AND NOT EXISTS (SELECT 1 FROM poller_outbox o WHERE o.event_id = ev.id)
            ORDER BY ev.created_at LIMIT :limit
            FOR UPDATE SKIP LOCKED
        )
        RETURNING 1
    )
    SELECT count(*) AS purged FROM gone
    """,
)
