"""Statements of the claim path (SPEC §5): claim, heartbeat, complete, reclaim."""

from __future__ import annotations

from poller.queries._registry import statement as _statement

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
              e.updated_at AS endpoint_updated_at, o.refunds, o.ordering_key
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
# the receiver saw is explained. Ended rows with an ordering key come back with
# it, and the rows of the keys they headed are locked here (after the outbox
# rows, as everywhere): the caller's next statement, ADVANCE_KEYS, hands the
# keys on with a snapshot taken after the locks were granted.
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
        RETURNING o.id, o.endpoint_id, o.status, o.ordering_key
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
    ), heads AS (
        SELECT k.endpoint_id
        FROM done
        JOIN poller_ordering_keys k
          ON k.endpoint_id = done.endpoint_id AND k.ordering_key = done.ordering_key
         AND k.head_id = done.id
        WHERE done.status IN ('delivered', 'failed')
        ORDER BY k.endpoint_id, k.ordering_key
        FOR UPDATE OF k
    )
    SELECT id, status, ordering_key, (SELECT count(*) FROM heads) AS heads_locked FROM done
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
