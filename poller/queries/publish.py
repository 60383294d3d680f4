"""Statements of fan-out (poller/fanout.py): publish, and replay to one endpoint."""

from __future__ import annotations

from poller.queries._registry import statement as _statement
from poller.schema import NOTIFY_CHANNEL


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


# Publish one event without an ordering key: keep the event once and insert a row
# per enabled endpoint it reaches, all in one statement of the caller's transaction.
# The rows carry no payload (their event's is sent), the event's key (so webhook-id
# is stable per endpoint) and the endpoint's attempt budget. An event whose
# (tenant, key) exists inserts nothing (PUBLISH_EXISTING says what it was). An
# endpoint that got no row (its key spent, or taken by an enqueued message) is
# listed in ``skipped``, and poller/fanout.py undoes the event and raises. ``schema``:
# the type's JSON Schema in the catalog (poller/catalog.py), for fanout.py to check the
# payload against before it answers (undoing the event if it does not match).
PUBLISH = _statement(
    "PUBLISH",
    f"""
    WITH doc AS (
        SELECT CAST(:payload AS jsonb) AS j, {patterns("CAST(:event_type AS text)")} AS matching
    ), targets AS (
        SELECT e.id, e.name, e.bucket, e.max_attempts
        FROM poller_endpoints e, doc
        WHERE e.enabled AND {reaches("e", "doc.matching", "doc.j", "CAST(:tenant AS text)")}
    ), ev AS (
        INSERT INTO poller_events
            (event_type, payload, idempotency_key, tenant, fanned_out, traceparent, tracestate)
        SELECT :event_type, CAST(:payload AS json), :idempotency_key, :tenant,
               (SELECT count(*) FROM targets), CAST(:traceparent AS text),
               CAST(:tracestate AS text)
        ON CONFLICT ((coalesce(tenant, '')), idempotency_key) DO NOTHING
        RETURNING id
    ), ins AS (
        INSERT INTO poller_outbox
            (endpoint_id, bucket, event_type, idempotency_key, max_attempts, next_attempt_at,
             event_id)
        SELECT t.id, t.bucket, :event_type, :idempotency_key,
               coalesce(t.max_attempts, CAST(:default_max_attempts AS integer)),
               coalesce(CAST(:deliver_at AS timestamptz),
                        now() + make_interval(secs => CAST(:delay AS double precision))),
               ev.id
        FROM ev CROSS JOIN targets t
        WHERE NOT EXISTS (SELECT 1 FROM poller_spent_keys k
                          WHERE k.endpoint_id = t.id AND k.idempotency_key = :idempotency_key)
        ORDER BY t.id
        ON CONFLICT (endpoint_id, idempotency_key) DO NOTHING
        RETURNING id, endpoint_id, bucket
    )
    SELECT (SELECT id FROM ev) AS event_id,
           (SELECT coalesce(json_agg(json_build_array(t.name, i.id)), '[]')
            FROM ins i JOIN targets t ON t.id = i.endpoint_id) AS deliveries,
           (SELECT coalesce(json_agg(t.name), '[]') FROM targets t
            WHERE EXISTS (SELECT 1 FROM ev)
              AND NOT EXISTS (SELECT 1 FROM ins WHERE ins.endpoint_id = t.id)) AS skipped,
           (SELECT count(pg_notify('{NOTIFY_CHANNEL}', CAST(b.bucket AS text)))
            FROM (SELECT DISTINCT bucket FROM ins) AS b
            WHERE CAST(:notify AS boolean)) AS woke,
           (SELECT CAST(c.schema AS text) FROM poller_event_types c
            WHERE c.name = :event_type) AS schema
    """,
)

# Undo a publish that could not reach every endpoint it should (PUBLISH's
# ``skipped``): its rows and the event go, so nothing half-published is committed.
UNPUBLISH = _statement(
    "UNPUBLISH",
    """
    WITH rows AS (DELETE FROM poller_outbox WHERE event_id = :event_id)
    DELETE FROM poller_events WHERE id = :event_id RETURNING id
    """,
)

# Why a publish skipped these endpoints: the key is spent on it, or a message with
# the key exists on it (enqueued, not this event's).
PUBLISH_SKIPPED = _statement(
    "PUBLISH_SKIPPED",
    """
    SELECT e.name, o.id AS existing_id,
           EXISTS (SELECT 1 FROM poller_spent_keys k
                   WHERE k.endpoint_id = e.id AND k.idempotency_key = :idempotency_key) AS spent
    FROM poller_endpoints e
    LEFT JOIN poller_outbox o ON o.endpoint_id = e.id AND o.idempotency_key = :idempotency_key
    WHERE e.name = ANY(CAST(:names AS text[]))
    ORDER BY e.name
    """,
)

# Publish a batch of events (publish_many, and any event with an ordering key),
# step 1: keep the new ones, in the order given. Events whose (tenant, key) exists
# are left out.
PUBLISH_EVENTS = _statement(
    "PUBLISH_EVENTS",
    """
    INSERT INTO poller_events
        (event_type, payload, idempotency_key, tenant, ordering_key, traceparent, tracestate)
    SELECT m.event_type, m.payload, m.idempotency_key, m.tenant, m.ordering_key,
           CAST(:traceparent AS text), CAST(:tracestate AS text)
    FROM unnest(
        CAST(:event_types AS text[]), CAST(:payloads AS json[]),
        CAST(:idempotency_keys AS text[]), CAST(:tenants AS text[]),
        CAST(:ordering_keys AS text[])
    ) WITH ORDINALITY AS m(event_type, payload, idempotency_key, tenant, ordering_key, ord)
    ORDER BY m.ord
    ON CONFLICT ((coalesce(tenant, '')), idempotency_key) DO NOTHING
    RETURNING id, idempotency_key, tenant,
              (SELECT CAST(c.schema AS text) FROM poller_event_types c
               WHERE c.name = poller_events.event_type) AS schema
    """,
)

# Step 2: each new event's enabled endpoints, in event then endpoint order, with what
# the rows need (the same columns as ENDPOINTS_BY_NAME); each event's count is
# recorded. The rows are then inserted by ENQUEUE_MANY, which places ordered ones
# behind their keys' heads.
FAN_OUT_TARGETS = _statement(
    "FAN_OUT_TARGETS",
    f"""
    WITH ev AS MATERIALIZED (
        SELECT ev.id, ev.tenant, CAST(ev.payload AS jsonb) AS j,
               {patterns("ev.event_type")} AS matching
        FROM poller_events ev
        WHERE ev.id = ANY(CAST(:event_ids AS bigint[]))
    ), t AS (
        SELECT ev.id AS event_id, e.name, e.id, e.bucket, e.enabled, e.disabled_reason,
               e.max_attempts
        FROM ev
        JOIN poller_endpoints e
          ON e.enabled AND {reaches("e", "ev.matching", "ev.j", "ev.tenant")}
    ), counted AS (
        UPDATE poller_events SET fanned_out = n.n
        FROM (SELECT event_id, count(*) AS n FROM t GROUP BY event_id) AS n
        WHERE poller_events.id = n.event_id
    )
    SELECT * FROM t
    ORDER BY event_id, id
    """,
)

# Events published before (same tenant and key): whether the content is the same
# (as JSON values, with the event type and ordering key), and their deliveries.
PUBLISH_EXISTING = _statement(
    "PUBLISH_EXISTING",
    """
    SELECT ev.id, m.ord,
           (CAST(ev.payload AS jsonb) = m.payload AND ev.event_type = m.event_type
            AND ev.ordering_key IS NOT DISTINCT FROM m.ordering_key) AS same_content,
           (SELECT coalesce(json_agg(json_build_array(e.name, o.id) ORDER BY e.name), '[]')
            FROM poller_outbox o JOIN poller_endpoints e ON e.id = o.endpoint_id
            WHERE o.event_id = ev.id) AS deliveries
    FROM unnest(
        CAST(:event_types AS text[]), CAST(:payloads AS jsonb[]),
        CAST(:idempotency_keys AS text[]), CAST(:tenants AS text[]),
        CAST(:ordering_keys AS text[])
    ) WITH ORDINALITY AS m(event_type, payload, idempotency_key, tenant, ordering_key, ord)
    JOIN poller_events ev
      ON coalesce(ev.tenant, '') = coalesce(m.tenant, '') AND ev.idempotency_key = m.idempotency_key
    """,
)

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
