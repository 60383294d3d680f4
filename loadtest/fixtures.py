"""Bulk data for benchmarks and plan tests, written with set-based SQL (fast)."""

from __future__ import annotations

from sqlalchemy import Connection, text

# History that must not slow the claim path: delivered rows with their timestamps.
_HISTORY = text("""
    INSERT INTO poller_outbox
        (endpoint_id, bucket, event_type, payload, idempotency_key, status, attempts,
         max_attempts, next_attempt_at, claim_token, delivered_at, created_at)
    SELECT :endpoint_id, :bucket, 'history.event', json_build_object('n', g),
           'history:' || g, 'delivered', 1, 10, now() - interval '1 day', 0,
           now() - interval '1 day' + g * interval '1 millisecond', now() - interval '1 day'
    FROM generate_series(1, :rows) AS g
""")

# Due pending rows, the claim path's real work.
_DUE = text("""
    INSERT INTO poller_outbox
        (endpoint_id, bucket, event_type, payload, idempotency_key, max_attempts, next_attempt_at)
    SELECT :endpoint_id, :bucket, 'due.event',
           json_build_object('n', g, 'pad', CAST(:pad AS text)), CAST(:prefix AS text) || g,
           10, now() - interval '1 second'
    FROM generate_series(1, :rows) AS g
""")


def insert_history(conn: Connection, endpoint_id: int, bucket: int, rows: int) -> None:
    conn.execute(_HISTORY, {"endpoint_id": endpoint_id, "bucket": bucket, "rows": rows})


def insert_due(
    conn: Connection, endpoint_id: int, bucket: int, rows: int, prefix: str = "due:", pad: int = 200
) -> None:
    params = {
        "endpoint_id": endpoint_id,
        "bucket": bucket,
        "rows": rows,
        "prefix": prefix,
        "pad": "x" * pad,
    }
    conn.execute(_DUE, params)


# Ordered rows waiting behind their keys' heads (:keys keys, :rows rows in all): the
# claim path must not read them; the hand-over reads one per key.
_WAITING = text("""
    WITH rows AS (
        INSERT INTO poller_outbox
            (endpoint_id, bucket, event_type, payload, idempotency_key, max_attempts,
             next_attempt_at, status, ordering_key)
        SELECT :endpoint_id, :bucket, 'ordered.event', json_build_object('n', g),
               'ordered:' || g, 10, now() - interval '1 second',
               CASE WHEN g <= :keys THEN 'pending' ELSE 'waiting' END,
               'key:' || ((g - 1) % :keys)
        FROM generate_series(1, :rows) AS g
        ORDER BY g
        RETURNING id, ordering_key
    )
    INSERT INTO poller_ordering_keys (endpoint_id, ordering_key, head_id)
    SELECT :endpoint_id, ordering_key, min(id) FROM rows GROUP BY ordering_key
""")


def insert_waiting(conn: Connection, endpoint_id: int, bucket: int, rows: int, keys: int) -> None:
    """``rows`` ordered messages over ``keys`` keys: each key's first pending, the rest waiting."""
    params = {"endpoint_id": endpoint_id, "bucket": bucket, "rows": rows, "keys": keys}
    conn.execute(_WAITING, params)
