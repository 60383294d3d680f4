"""Statements of the maintenance leader (retention, gauges) and summaries."""

from __future__ import annotations

from poller.store.queries._registry import statement as _statement


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

# Gauges (maintenance leader): the endpoints with something to show — due
# messages (how many, the oldest's age), ordered messages waiting or keys blocked,
# a circuit not closed, disabled (with the pending messages that wait for it) —
# each with all of these. An endpoint at rest has no row, and poller/service/maintenance.py
# removes its series: a product whose customers registered 10,000 endpoints
# exported 90,000 series, mostly zeros, and the refresh took 0.5 s of the leader's
# CPU every 5 s. Each set is read from its own partial index or small table.
GAUGE_ENDPOINTS = _statement(
    "GAUGE_ENDPOINTS",
    """
    WITH due AS (
        SELECT o.endpoint_id, count(*) AS due,
               extract(epoch FROM now() - min(o.next_attempt_at)) AS oldest_seconds
        FROM poller_outbox o
        WHERE o.status = 'pending' AND o.next_attempt_at <= now()
        GROUP BY o.endpoint_id
    ), waiting AS (
        SELECT w.endpoint_id, count(*) AS waiting
        FROM poller_outbox w WHERE w.status = 'waiting'
        GROUP BY w.endpoint_id
    ), blocked AS (
        SELECT k.endpoint_id, count(*) AS blocked,
               extract(epoch FROM now() - min(k.blocked_since)) AS blocked_seconds
        FROM poller_ordering_keys k WHERE k.blocked_since IS NOT NULL
        GROUP BY k.endpoint_id
    ), shown AS (
        SELECT endpoint_id FROM due
        UNION SELECT endpoint_id FROM waiting
        UNION SELECT endpoint_id FROM blocked
        UNION SELECT endpoint_id FROM poller_endpoint_health WHERE state <> 'closed'
        UNION SELECT id FROM poller_endpoints WHERE NOT enabled
    )
    SELECT e.name, coalesce(due.due, 0) AS due,
           coalesce(due.oldest_seconds, 0) AS oldest_seconds,
           coalesce(blocked.blocked, 0) AS blocked,
           coalesce(blocked.blocked_seconds, 0) AS blocked_seconds,
           coalesce(waiting.waiting, 0) AS waiting,
           e.enabled, coalesce(h.state, 'closed') AS state,
           CASE WHEN h.opened_at IS NULL THEN 0
                ELSE extract(epoch FROM now() - h.opened_at) END AS open_seconds,
           CASE WHEN e.enabled THEN 0
                ELSE (SELECT count(*) FROM poller_outbox o
                      WHERE o.bucket = e.bucket AND o.endpoint_id = e.id
                        AND o.status = 'pending') END AS disabled_pending
    FROM shown
    JOIN poller_endpoints e ON e.id = shown.endpoint_id
    LEFT JOIN poller_endpoint_health h ON h.endpoint_id = e.id
    LEFT JOIN due ON due.endpoint_id = e.id
    LEFT JOIN waiting ON waiting.endpoint_id = e.id
    LEFT JOIN blocked ON blocked.endpoint_id = e.id
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
