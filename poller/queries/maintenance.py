"""Statements of the maintenance leader (retention, gauges) and summaries."""

from __future__ import annotations

from poller.queries._registry import statement as _statement


# Retention: delete up to :limit delivered (failed, cancelled) rows older than :age
# seconds, with their attempts (cascade), keeping their keys as spent keys so
# the same key cannot start a second message. Small batches keep locks short.
# The failed head of a blocked ordering key is kept: its key waits on it.
def _purge(status: str, since: str) -> str:
    return f"""
    WITH gone AS (
        DELETE FROM poller_outbox WHERE id IN (
            SELECT id FROM poller_outbox
            WHERE status = '{status}'
              AND {since} < now() - make_interval(secs => CAST(:age AS double precision))
              AND NOT EXISTS (SELECT 1 FROM poller_ordering_keys k
                              WHERE k.endpoint_id = poller_outbox.endpoint_id
                                AND k.ordering_key = poller_outbox.ordering_key
                                AND k.head_id = poller_outbox.id)
            ORDER BY {since} LIMIT :limit
            FOR UPDATE SKIP LOCKED
        )
        RETURNING endpoint_id, idempotency_key
    ), kept AS (
        INSERT INTO poller_spent_keys (endpoint_id, idempotency_key)
        SELECT endpoint_id, idempotency_key FROM gone
        ON CONFLICT DO NOTHING
    )
    SELECT count(*) AS purged FROM gone
    """


PURGE_DELIVERED = _statement("PURGE_DELIVERED", _purge("delivered", "delivered_at"))
PURGE_FAILED = _statement("PURGE_FAILED", _purge("failed", "failed_at"))
PURGE_CANCELLED = _statement("PURGE_CANCELLED", _purge("cancelled", "cancelled_at"))

# Spent keys past POLLER_RETENTION_KEYS: from then on the key may start a new message.
PURGE_SPENT_KEYS = _statement(
    "PURGE_SPENT_KEYS",
    """
    WITH gone AS (
        DELETE FROM poller_spent_keys WHERE (endpoint_id, idempotency_key) IN (
            SELECT endpoint_id, idempotency_key FROM poller_spent_keys
            WHERE purged_at < now() - make_interval(secs => CAST(:age AS double precision))
            ORDER BY purged_at LIMIT :limit
            FOR UPDATE SKIP LOCKED
        )
        RETURNING 1
    )
    SELECT count(*) AS purged FROM gone
    """,
)

# Gauges (maintenance leader): due pending messages and the oldest one's age,
# per endpoint, from the per-endpoint partial index.
GAUGE_DUE = _statement(
    "GAUGE_DUE",
    """
    SELECT e.name, count(o.id) AS due,
           coalesce(extract(epoch FROM now() - min(o.next_attempt_at)), 0) AS oldest_seconds
    FROM poller_endpoints e
    LEFT JOIN poller_outbox o
           ON o.endpoint_id = e.id AND o.status = 'pending' AND o.next_attempt_at <= now()
    GROUP BY e.name
    """,
)

# Gauges: messages by status, except delivered (history; counting it would scan
# it all — delivered throughput comes from the counters).
GAUGE_STATUS = _statement(
    "GAUGE_STATUS",
    """
    SELECT 'pending' AS status, count(*) AS n FROM poller_outbox WHERE status = 'pending'
    UNION ALL
    SELECT 'in_flight', count(*) FROM poller_outbox WHERE status = 'in_flight'
    UNION ALL
    SELECT 'failed', count(*) FROM poller_outbox WHERE status = 'failed'
    UNION ALL
    SELECT 'waiting', count(*) FROM poller_outbox WHERE status = 'waiting'
    UNION ALL
    SELECT 'cancelled', count(*) FROM poller_outbox WHERE status = 'cancelled'
    """,
)


# --- summaries (the demo) -----------------------------------------------------------

# Messages by status (all of them: the demo's table is small).
COUNT_BY_STATUS = _statement(
    "COUNT_BY_STATUS", "SELECT status, count(*) FROM poller_outbox GROUP BY 1"
)

# Failed messages by endpoint and last error, most common first.
FAILED_BY_REASON = _statement(
    "FAILED_BY_REASON",
    """
    SELECT e.name, o.last_error, count(*) FROM poller_outbox o
    JOIN poller_endpoints e ON e.id = o.endpoint_id
    WHERE o.status = 'failed'
    GROUP BY 1, 2 ORDER BY 3 DESC
    """,
)

# Messages with this idempotency key, on any endpoint.
COUNT_WITH_KEY = _statement(
    "COUNT_WITH_KEY", "SELECT count(*) FROM poller_outbox WHERE idempotency_key = :key"
)
