"""Statements of the enqueue API, run inside the application's transaction."""

from __future__ import annotations

from poller.queries._registry import statement as _statement
from poller.schema import NOTIFY_CHANNEL

# --- enqueue (inside the application's transaction) --------------------------

# Insert one message unless (endpoint, key) exists; an unknown or disabled
# endpoint inserts nothing. The NOTIFY is queued in the caller's transaction and
# so reaches listeners only if it commits (and is merged with others per bucket).
ENQUEUE_ONE = _statement(
    "ENQUEUE_ONE",
    f"""
    WITH ins AS (
        INSERT INTO poller_outbox
            (endpoint_id, bucket, event_type, payload, idempotency_key, max_attempts,
             next_attempt_at, traceparent, tracestate)
        SELECT e.id, e.bucket, :event_type, CAST(:payload AS json), :idempotency_key,
               coalesce(CAST(:max_attempts AS integer), e.max_attempts,
                        CAST(:default_max_attempts AS integer)),
               coalesce(CAST(:deliver_at AS timestamptz),
                        now() + make_interval(secs => CAST(:delay AS double precision))),
               CAST(:traceparent AS text), CAST(:tracestate AS text)
        FROM poller_endpoints e
        WHERE e.name = :endpoint AND e.enabled
          AND NOT EXISTS (SELECT 1 FROM poller_spent_keys k
                          WHERE k.endpoint_id = e.id AND k.idempotency_key = :idempotency_key)
        ON CONFLICT (endpoint_id, idempotency_key) DO NOTHING
        RETURNING id, bucket
    )
    SELECT ins.id,
           CASE WHEN CAST(:notify AS boolean)
                THEN pg_notify('{NOTIFY_CHANNEL}', CAST(ins.bucket AS text)) END AS woke
    FROM ins
    """,
)

# Why ENQUEUE_ONE inserted nothing: unknown endpoint (no row), disabled
# endpoint, an existing message with this key (same content or not), or a key
# whose message was purged (spent).
ENQUEUE_EXPLAIN = _statement(
    "ENQUEUE_EXPLAIN",
    """
    SELECT e.enabled, e.disabled_reason, o.id AS existing_id,
           (CAST(o.payload AS jsonb) = CAST(:payload AS jsonb)
            AND o.event_type = :event_type AND o.ordering_key IS NULL) AS same_content,
           EXISTS (SELECT 1 FROM poller_spent_keys k
                   WHERE k.endpoint_id = e.id AND k.idempotency_key = :idempotency_key) AS spent
    FROM poller_endpoints e
    LEFT JOIN poller_outbox o ON o.endpoint_id = e.id AND o.idempotency_key = :idempotency_key
    WHERE e.name = :endpoint
    """,
)

# Endpoint facts enqueue_many needs to validate a batch before writing.
ENDPOINTS_BY_NAME = _statement(
    "ENDPOINTS_BY_NAME",
    """
    SELECT name, id, bucket, enabled, disabled_reason, max_attempts
    FROM poller_endpoints
    WHERE name = ANY(CAST(:names AS text[]))
    """,
)

# Insert a batch in one statement; rows whose (endpoint, key) exists are
# skipped and resolved by ENQUEUE_MANY_EXISTING, and so are spent keys.
# Ordered messages come with their status (pending for a key's head, waiting
# behind it) from poller/ordering.py, under their keys' locks; rows are inserted
# in the order given, so a key's ids grow in that order. A published event's rows
# (poller/fanout.py) come with its id and no payload of their own.
ENQUEUE_MANY = _statement(
    "ENQUEUE_MANY",
    """
    INSERT INTO poller_outbox
        (endpoint_id, bucket, event_type, payload, idempotency_key, max_attempts, next_attempt_at,
         ordering_key, status, event_id, traceparent, tracestate)
    SELECT m.endpoint_id, m.bucket, m.event_type, m.payload, m.idempotency_key, m.max_attempts,
           coalesce(m.deliver_at, now() + make_interval(secs => m.delay)),
           m.ordering_key, coalesce(m.status, 'pending'), m.event_id,
           CAST(:traceparent AS text), CAST(:tracestate AS text)
    FROM unnest(
        CAST(:endpoint_ids AS bigint[]), CAST(:buckets AS smallint[]),
        CAST(:event_types AS text[]), CAST(:payloads AS json[]),
        CAST(:idempotency_keys AS text[]), CAST(:max_attempts AS integer[]),
        CAST(:deliver_ats AS timestamptz[]), CAST(:delays AS double precision[]),
        CAST(:ordering_keys AS text[]), CAST(:statuses AS text[]), CAST(:event_ids AS bigint[])
    ) WITH ORDINALITY AS m(endpoint_id, bucket, event_type, payload, idempotency_key,
                           max_attempts, deliver_at, delay, ordering_key, status, event_id, ord)
    WHERE NOT EXISTS (SELECT 1 FROM poller_spent_keys k
                      WHERE k.endpoint_id = m.endpoint_id AND k.idempotency_key = m.idempotency_key)
    ORDER BY m.ord
    ON CONFLICT (endpoint_id, idempotency_key) DO NOTHING
    RETURNING id, endpoint_id, idempotency_key, ordering_key
    """,
)

# The existing rows for keys ENQUEUE_MANY skipped, and whether their content matches
# (as JSON values: the same payload serialized with another key order is the same;
# the event type and the ordering key too).
ENQUEUE_MANY_EXISTING = _statement(
    "ENQUEUE_MANY_EXISTING",
    """
    SELECT o.id, o.endpoint_id, o.idempotency_key,
           (CAST(o.payload AS jsonb) = m.payload AND o.event_type = m.event_type
            AND o.ordering_key IS NOT DISTINCT FROM m.ordering_key) AS same_content
    FROM unnest(
        CAST(:endpoint_ids AS bigint[]), CAST(:idempotency_keys AS text[]),
        CAST(:payloads AS jsonb[]), CAST(:event_types AS text[]),
        CAST(:ordering_keys AS text[])
    ) AS m(endpoint_id, idempotency_key, payload, event_type, ordering_key)
    JOIN poller_outbox o ON o.endpoint_id = m.endpoint_id AND o.idempotency_key = m.idempotency_key
    """,
)

# Wake pollers of these buckets when the caller's transaction commits.
NOTIFY_BUCKETS = _statement(
    "NOTIFY_BUCKETS",
    f"""
    SELECT pg_notify('{NOTIFY_CHANNEL}', CAST(b AS text))
    FROM unnest(CAST(:buckets AS integer[])) AS b
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
