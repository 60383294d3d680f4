"""Every SQL statement the runtime issues, named, with what it guarantees.

Statements use ``:name`` parameters and ``CAST(… AS …)`` (never ``::``) so the
same text runs through SQLAlchemy's ``text()`` and, after a mechanical rewrite,
through plain psycopg (see loadtest/claims.py, which measures the difference).
Batches travel as arrays or one JSON document and are unnested server-side:
one statement per batch, never one per row.

``STATEMENTS`` maps each name to its SQL; tests/integration/test_queries.py
runs every one against the migrated schema.
"""

from __future__ import annotations

from sqlalchemy import TextClause, text

from poller.schema import NOTIFY_CHANNEL

STATEMENTS: dict[str, str] = {}


def _statement(name: str, sql: str) -> TextClause:
    STATEMENTS[name] = sql
    return text(sql)


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
             next_attempt_at)
        SELECT e.id, e.bucket, :event_type, CAST(:payload AS jsonb), :idempotency_key,
               coalesce(CAST(:max_attempts AS integer), e.max_attempts,
                        CAST(:default_max_attempts AS integer)),
               coalesce(CAST(:deliver_at AS timestamptz),
                        now() + make_interval(secs => CAST(:delay AS double precision)))
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
           (o.payload = CAST(:payload AS jsonb) AND o.event_type = :event_type) AS same_content,
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
ENQUEUE_MANY = _statement(
    "ENQUEUE_MANY",
    """
    INSERT INTO poller_outbox
        (endpoint_id, bucket, event_type, payload, idempotency_key, max_attempts, next_attempt_at)
    SELECT m.endpoint_id, m.bucket, m.event_type, m.payload, m.idempotency_key, m.max_attempts,
           coalesce(m.deliver_at, now() + make_interval(secs => m.delay))
    FROM unnest(
        CAST(:endpoint_ids AS bigint[]), CAST(:buckets AS smallint[]),
        CAST(:event_types AS text[]), CAST(:payloads AS jsonb[]),
        CAST(:idempotency_keys AS text[]), CAST(:max_attempts AS integer[]),
        CAST(:deliver_ats AS timestamptz[]), CAST(:delays AS double precision[])
    ) WITH ORDINALITY AS m(endpoint_id, bucket, event_type, payload, idempotency_key,
                           max_attempts, deliver_at, delay, ord)
    WHERE NOT EXISTS (SELECT 1 FROM poller_spent_keys k
                      WHERE k.endpoint_id = m.endpoint_id AND k.idempotency_key = m.idempotency_key)
    ORDER BY m.ord
    ON CONFLICT (endpoint_id, idempotency_key) DO NOTHING
    RETURNING id, endpoint_id, idempotency_key
    """,
)

# The existing rows for keys ENQUEUE_MANY skipped, and whether their content matches.
ENQUEUE_MANY_EXISTING = _statement(
    "ENQUEUE_MANY_EXISTING",
    """
    SELECT o.id, o.endpoint_id, o.idempotency_key,
           (o.payload = m.payload AND o.event_type = m.event_type) AS same_content
    FROM unnest(
        CAST(:endpoint_ids AS bigint[]), CAST(:idempotency_keys AS text[]),
        CAST(:payloads AS jsonb[]), CAST(:event_types AS text[])
    ) AS m(endpoint_id, idempotency_key, payload, event_type)
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

# --- claims (§5) --------------------------------------------------------------

# Claim up to :limit due rows of the given buckets, fairly between endpoints.
# Each enabled endpoint gets at most its free in-flight room (its max_in_flight
# minus what this poller already holds for it, given as JSON); endpoints are
# visited in a fresh random order each time and each one's rows come, oldest
# due first, from its own partial index. So one endpoint's backlog, or a slow
# endpoint at its cap, never starves the others, and a disabled endpoint's
# rows wait. Each row comes back with its endpoint's updated_at, so a poller
# notices an endpoint changed (new URL, secret) before it sends. SKIP LOCKED
# lets pollers share a shard without waiting on each other. Attempts are
# counted here, at claim time, so a message that kills its poller still runs
# out of attempts; one new claim_token per batch fences every later write for
# these attempts; the lease is measured on the database clock.
CLAIM_BATCH = _statement(
    "CLAIM_BATCH",
    """
    WITH busy AS (
        SELECT * FROM jsonb_to_recordset(CAST(:in_flight AS jsonb))
            AS b(endpoint_id bigint, n integer)
    ), ready AS (
        SELECT e.id,
               coalesce(e.max_in_flight, CAST(:default_max_in_flight AS integer))
                   - coalesce(busy.n, 0) AS room
        FROM poller_endpoints e
        LEFT JOIN busy ON busy.endpoint_id = e.id
        WHERE e.enabled AND e.bucket = ANY(CAST(:buckets AS smallint[]))
        ORDER BY md5(CAST(e.id AS text) || :salt)
    ), due AS (
        SELECT picked.id
        FROM ready
        CROSS JOIN LATERAL (
            SELECT o.id FROM poller_outbox o
            WHERE o.endpoint_id = ready.id
              AND o.status = 'pending'
              AND o.next_attempt_at <= now()
            ORDER BY o.next_attempt_at, o.id
            LIMIT greatest(ready.room, 0)
            FOR UPDATE SKIP LOCKED
        ) AS picked
        WHERE ready.room > 0
        LIMIT :limit
    ), token AS (
        SELECT nextval('poller_claim_token_seq') AS claim_token
    )
    UPDATE poller_outbox o
    SET status = 'in_flight',
        attempts = o.attempts + 1,
        claim_token = token.claim_token,
        claimed_by = :claimed_by,
        claim_expires_at = now() + make_interval(secs => CAST(:claim_lease AS double precision)),
        updated_at = now()
    FROM due, token, poller_endpoints e
    WHERE o.id = due.id AND e.id = o.endpoint_id
    RETURNING o.id, o.endpoint_id, o.bucket, o.event_type, CAST(o.payload AS text) AS payload,
              o.idempotency_key, o.attempts, o.max_attempts, o.claim_token,
              o.claim_expires_at, o.needs_lookup, o.created_at,
              e.updated_at AS endpoint_updated_at, o.refunds
    """,
)

# The endpoints of just-claimed messages that the poller's cache lacks or holds an
# older version of (url, secrets, limits); read in the claim's own transaction.
ENDPOINTS_BY_ID = _statement(
    "ENDPOINTS_BY_ID",
    "SELECT * FROM poller_endpoints WHERE id = ANY(CAST(:ids AS bigint[]))",
)

# Claim-lease heartbeat: extend the leases of rows this poller is still working
# on (delivering, or writing the outcome of), one statement for all of them.
# Fenced by claim token: a row reclaimed meanwhile is neither extended nor returned.
EXTEND_CLAIMS = _statement(
    "EXTEND_CLAIMS",
    """
    UPDATE poller_outbox o
    SET claim_expires_at = now() + make_interval(secs => CAST(:claim_lease AS double precision))
    FROM unnest(CAST(:ids AS bigint[]), CAST(:tokens AS bigint[])) AS h(id, claim_token)
    WHERE o.id = h.id AND o.claim_token = h.claim_token AND o.status = 'in_flight'
    RETURNING o.id
    """,
)

# Apply a batch of outcomes, each fenced by (id, claim_token, in_flight): a
# write from a superseded claim matches no row and changes nothing. The batch
# is one JSON array (absent keys are NULL): json.dumps is several times
# cheaper than adapting fifteen parallel arrays. The status,
# retry delay, lookup flag and refund are decided by the caller
# (poller/claims.py) from the claimed row; this statement only applies them
# (counting refunds), disables an endpoint that answered 410 when that outcome
# applied, and records each attempt that reached the wire in
# poller_delivery_attempts — stale ones too, marked stale, so every duplicate
# the receiver saw is explained.
COMPLETE_BATCH = _statement(
    "COMPLETE_BATCH",
    """
    WITH c AS (
        SELECT * FROM jsonb_to_recordset(CAST(:outcomes AS jsonb)) AS c(
            id bigint, claim_token bigint, attempt integer, status text, outcome text,
            retry_delay double precision, needs_lookup boolean, refund integer,
            status_code integer, error_class text, error_message text, kind text,
            started_at timestamptz, duration_ms double precision, response_excerpt text,
            disable_reason text)
    ), done AS (
        UPDATE poller_outbox o
        SET status = c.status,
            attempts = o.attempts - coalesce(c.refund, 0),
            refunds = o.refunds + coalesce(c.refund, 0),
            needs_lookup = coalesce(c.needs_lookup, o.needs_lookup),
            next_attempt_at = CASE WHEN c.status = 'pending'
                THEN now() + make_interval(secs => coalesce(c.retry_delay, 0))
                ELSE o.next_attempt_at END,
            claim_expires_at = NULL,
            last_status_code = CASE WHEN c.kind IS NULL THEN o.last_status_code
                ELSE c.status_code END,
            last_error = CASE WHEN c.kind IS NULL THEN o.last_error ELSE c.error_message END,
            delivered_at = CASE WHEN c.status = 'delivered' THEN now() END,
            failed_at = CASE WHEN c.status = 'failed' THEN now() END,
            updated_at = now()
        FROM c
        WHERE o.id = c.id AND o.claim_token = c.claim_token AND o.status = 'in_flight'
        RETURNING o.id, o.endpoint_id
    ), disabled AS (
        UPDATE poller_endpoints e
        SET enabled = false, disabled_reason = c.disable_reason, updated_at = now()
        FROM c JOIN done ON done.id = c.id
        WHERE e.id = done.endpoint_id AND c.disable_reason IS NOT NULL AND e.enabled
    ), recorded AS (
        INSERT INTO poller_delivery_attempts
            (message_id, attempt, kind, claim_token, poller_id, started_at, duration_ms,
             outcome, status_code, error_class, error_message, response_excerpt, stale)
        SELECT c.id, c.attempt, c.kind, c.claim_token, :poller_id, c.started_at, c.duration_ms,
               c.outcome, c.status_code, c.error_class, c.error_message, c.response_excerpt,
               NOT EXISTS (SELECT 1 FROM done WHERE done.id = c.id)
        FROM c
        WHERE c.kind IS NOT NULL
          AND EXISTS (SELECT 1 FROM poller_outbox x WHERE x.id = c.id)
    )
    SELECT id FROM done
    """,
)

# Reclaim claims whose lease expired (their poller died or stalled): back to
# pending with needs_lookup (the send may have happened), or failed when the
# attempt budget is spent. SKIP LOCKED: never waits on, or deadlocks with, a
# completion racing for the same row — that row is left for the next sweep.
RECLAIM_EXPIRED = _statement(
    "RECLAIM_EXPIRED",
    """
    WITH expired AS (
        SELECT id FROM poller_outbox
        WHERE status = 'in_flight' AND claim_expires_at < now()
        ORDER BY claim_expires_at
        LIMIT :limit
        FOR UPDATE SKIP LOCKED
    ), reclaimed AS (
        UPDATE poller_outbox o
        SET status = CASE WHEN o.attempts >= o.max_attempts THEN 'failed' ELSE 'pending' END,
            needs_lookup = o.attempts < o.max_attempts,
            next_attempt_at = now(),
            claim_expires_at = NULL,
            last_error = 'claim lease expired: poller ' || coalesce(o.claimed_by, '?')
                         || ' did not complete attempt ' || o.attempts,
            failed_at = CASE WHEN o.attempts >= o.max_attempts THEN now() END,
            updated_at = now()
        FROM expired
        WHERE o.id = expired.id
        RETURNING o.id, o.status, o.attempts, o.claim_token, o.claimed_by
    ), recorded AS (
        INSERT INTO poller_delivery_attempts
            (message_id, attempt, kind, claim_token, poller_id, outcome, error_class,
             error_message)
        SELECT id, attempts, 'send', claim_token, claimed_by, 'lease_expired',
               'ClaimLeaseExpired', 'claim lease expired before the poller completed'
        FROM reclaimed
    )
    SELECT id, status FROM reclaimed
    """,
)


# --- election and shards (SPEC §6) ------------------------------------------------

# A setting every poller must agree on (shard count, election backend): the
# first poller records it; the recorded value comes back either way.
CLUSTER_FACT = _statement(
    "CLUSTER_FACT",
    """
    WITH recorded AS (
        INSERT INTO poller_cluster (key, value) VALUES (:key, :value)
        ON CONFLICT (key) DO NOTHING
        RETURNING value
    )
    SELECT value FROM recorded
    UNION ALL
    SELECT value FROM poller_cluster WHERE key = :key
    """,
)

# One fence row per shard, so claims can check and advance them.
ENSURE_SHARD_FENCES = _statement(
    "ENSURE_SHARD_FENCES",
    """
    INSERT INTO poller_shard_fences (shard)
    SELECT generate_series(0, CAST(:shards AS integer) - 1)
    ON CONFLICT (shard) DO NOTHING
    """,
)

# The last fence PostgreSQL accepted per shard: the floor a new lease must exceed.
SHARD_FENCES = _statement("SHARD_FENCES", "SELECT shard, fence FROM poller_shard_fences")

# Check and advance shard fences, in the claim's own transaction: a fence below
# the last accepted one is a superseded leader's, and its shard is refused; an
# equal fence is accepted only from the poller that set it (two holders can
# never share one fence). The row locks taken here serialize claims per shard
# until the claim commits.
FENCE_SHARDS = _statement(
    "FENCE_SHARDS",
    """
    WITH offered AS (
        SELECT * FROM jsonb_to_recordset(CAST(:fences AS jsonb)) AS x(shard integer, fence bigint)
    )
    UPDATE poller_shard_fences f
    SET fence = offered.fence, holder = :holder, updated_at = now()
    FROM offered
    WHERE f.shard = offered.shard
      AND (f.fence < offered.fence
           OR (f.fence = offered.fence AND f.holder IS NOT DISTINCT FROM :holder))
    RETURNING f.shard
    """,
)

# A newly won shard's fence write must not queue behind a frozen old leader's
# claim transaction (which holds the fence row): fail fast, try next tick.
LOCK_TIMEOUT = _statement(
    "LOCK_TIMEOUT", "SELECT set_config('lock_timeout', CAST(:ms AS text), true)"
)

# postgres backend: take a free or expired lease (or keep one's own), on the
# database clock. The fence grows on every change of holder and never falls
# below :floor (the shard's last accepted fence).
LEASE_ACQUIRE = _statement(
    "LEASE_ACQUIRE",
    """
    INSERT INTO poller_leases AS l (key, holder, fence, expires_at)
    VALUES (:key, :holder, CAST(:floor AS bigint) + 1,
            now() + make_interval(secs => CAST(:ttl AS double precision)))
    ON CONFLICT (key) DO UPDATE
    SET holder = EXCLUDED.holder,
        fence = CASE WHEN l.holder = EXCLUDED.holder AND l.expires_at >= now() THEN l.fence
                     ELSE greatest(l.fence, CAST(:floor AS bigint)) + 1 END,
        expires_at = EXCLUDED.expires_at
    WHERE l.expires_at < now() OR l.holder = EXCLUDED.holder
    RETURNING l.fence
    """,
)

# postgres backend: extend one's own unexpired lease.
LEASE_RENEW = _statement(
    "LEASE_RENEW",
    """
    UPDATE poller_leases
    SET expires_at = now() + make_interval(secs => CAST(:ttl AS double precision))
    WHERE key = :key AND holder = :holder AND fence = :fence AND expires_at >= now()
    RETURNING fence
    """,
)

# postgres backend: give a lease up now (the row stays, so the fence keeps growing).
LEASE_RELEASE = _statement(
    "LEASE_RELEASE",
    """
    UPDATE poller_leases SET expires_at = now() - interval '1 millisecond'
    WHERE key = :key AND holder = :holder AND fence = :fence
    """,
)

# postgres backend: live leases with seconds left.
LEASE_HOLDERS = _statement(
    "LEASE_HOLDERS",
    """
    SELECT key, holder, fence,
           extract(epoch FROM expires_at - now()) AS expires_in
    FROM poller_leases WHERE expires_at > now() ORDER BY key
    """,
)

# postgres backend: this poller is alive for :ttl more seconds; who else is.
MEMBER_HEARTBEAT = _statement(
    "MEMBER_HEARTBEAT",
    """
    WITH beat AS (
        INSERT INTO poller_members (poller_id, expires_at)
        VALUES (:poller_id, now() + make_interval(secs => CAST(:ttl AS double precision)))
        ON CONFLICT (poller_id) DO UPDATE SET expires_at = EXCLUDED.expires_at
        RETURNING poller_id
    )
    SELECT poller_id FROM beat
    UNION
    SELECT poller_id FROM poller_members WHERE expires_at > now()
    """,
)

MEMBER_LEAVE = _statement("MEMBER_LEAVE", "DELETE FROM poller_members WHERE poller_id = :poller_id")

# The schema revision Alembic recorded (readiness checks).
SCHEMA_REVISION = _statement("SCHEMA_REVISION", "SELECT version_num FROM poller_alembic_version")

# Retention: delete up to :limit delivered (or failed) rows older than :age
# seconds, with their attempts (cascade), keeping their keys as spent keys so
# the same key cannot start a second message. Small batches keep locks short.
PURGE_DELIVERED = _statement(
    "PURGE_DELIVERED",
    """
    WITH gone AS (
        DELETE FROM poller_outbox WHERE id IN (
            SELECT id FROM poller_outbox
            WHERE status = 'delivered'
              AND delivered_at < now() - make_interval(secs => CAST(:age AS double precision))
            ORDER BY delivered_at LIMIT :limit
            FOR UPDATE SKIP LOCKED
        )
        RETURNING endpoint_id, idempotency_key
    ), kept AS (
        INSERT INTO poller_spent_keys (endpoint_id, idempotency_key)
        SELECT endpoint_id, idempotency_key FROM gone
        ON CONFLICT DO NOTHING
    )
    SELECT count(*) AS purged FROM gone
    """,
)

PURGE_FAILED = _statement(
    "PURGE_FAILED",
    """
    WITH gone AS (
        DELETE FROM poller_outbox WHERE id IN (
            SELECT id FROM poller_outbox
            WHERE status = 'failed'
              AND failed_at < now() - make_interval(secs => CAST(:age AS double precision))
            ORDER BY failed_at LIMIT :limit
            FOR UPDATE SKIP LOCKED
        )
        RETURNING endpoint_id, idempotency_key
    ), kept AS (
        INSERT INTO poller_spent_keys (endpoint_id, idempotency_key)
        SELECT endpoint_id, idempotency_key FROM gone
        ON CONFLICT DO NOTHING
    )
    SELECT count(*) AS purged FROM gone
    """,
)

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
