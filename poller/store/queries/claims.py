"""Statements of the claim path: claim, heartbeat, complete, reclaim."""

from __future__ import annotations

from poller.store.queries._registry import statement as _statement
from poller.store.queries.cluster import OFFERED_FENCES, fencing
from poller.store.schema import CIRCUIT_HOLD

# --- claims (§5) --------------------------------------------------------------

# What a claim writes (one attempt more, a fresh claim token, the lease on the
# database clock) and returns, in CLAIM_BATCH and CLAIM_GOVERNED alike.
CLAIMING = """SET status = 'in_flight',
        attempts = o.attempts + 1,
        claim_token = token.claim_token,
        claimed_by = :claimed_by,
        claim_expires_at = now() + make_interval(secs => CAST(:claim_lease AS double precision)),
        updated_at = now()"""
# A published event's rows have no payload of their own: the event's is read once
# per row claimed (coalesce evaluates the subquery only for those rows); so is its
# trace context (poller/rules/tracing.py), an enqueued message's being its own; and, for an
# event whose payload no door checked against its type's schema (a SQL door cannot),
# that schema: poller/deliver/dispatcher.py checks the payload before any send.
CLAIMED = """o.id, o.endpoint_id, o.bucket, o.event_type,
    CAST(coalesce(o.payload, (SELECT ev.payload FROM poller_events ev WHERE ev.id = o.event_id))
         AS text) AS payload,
    o.idempotency_key, o.attempts, o.max_attempts, o.claim_token,
    o.claim_expires_at, o.needs_lookup, o.created_at,
    (SELECT e.updated_at FROM poller_endpoints e WHERE e.id = o.endpoint_id)
        AS endpoint_updated_at,
    o.refunds, o.ordering_key,
    CASE WHEN o.ordering_key IS NOT NULL THEN coalesce(o.event_id, o.id) END AS position,
    coalesce(o.traceparent, (SELECT ev.traceparent FROM poller_events ev
                             WHERE ev.id = o.event_id)) AS traceparent,
    coalesce(o.tracestate, (SELECT ev.tracestate FROM poller_events ev
                            WHERE ev.id = o.event_id)) AS tracestate,
    (SELECT c.schema::text FROM poller_events ev JOIN poller_event_types c
     ON c.name = ev.event_type WHERE ev.id = o.event_id AND NOT ev.payload_checked)
        AS payload_schema"""


def bucket_step(walk: str, found: str = "c.b, c.id", none: str = "") -> str:
    """The end of a step of a walk in turn by (bucket, id) through an index led by the
    bucket (PENDING_IN_TURN; the governed claim's GOVERNED_IN_TURN). Given the walk's
    last row ``walk`` (with ``lap``, the cursor ``ab``, ``ae`` and ``top``, the
    greatest bigint) and the next pair the step found, ``c`` (``b``, ``id``; NULLs
    for none), the row the step adds, ``x``: ``found`` (``c``'s columns) when its
    bucket is one of :buckets; else a jump to just before the next of them, ``(nb -
    1, top)`` and ``none`` (the NULLs of ``found``'s other columns), that the next
    step's descent starts after; past the last of them, or when nothing is found,
    ``(-1, top)`` to go around (``lap`` 1) from the first; nothing when the lap
    around reached the cursor."""
    return f"""CROSS JOIN LATERAL (
            SELECT c.b IS NOT NULL AND ({walk}.lap = 0 OR (c.b, c.id) <= ({walk}.ab, {walk}.ae))
                       AS ok,
                   c.b = ANY(CAST(:buckets AS smallint[])) AS ours
        ) AS k
        CROSS JOIN LATERAL (  -- the next of :buckets, read only past one not ours
            SELECT CASE WHEN NOT k.ours THEN (
                SELECT min(u) FROM unnest(CAST(:buckets AS smallint[])) AS u WHERE u > c.b)
            END AS nb
        ) AS j
        CROSS JOIN LATERAL (
            SELECT {found}, {walk}.lap WHERE k.ok AND k.ours
            UNION ALL
            SELECT CAST(j.nb - 1 AS smallint), {walk}.top{none}, {walk}.lap
            WHERE k.ok AND NOT k.ours AND j.nb IS NOT NULL
            UNION ALL
            SELECT CAST(-1 AS smallint), {walk}.top{none}, 1
            WHERE {walk}.lap = 0 AND NOT (k.ok AND (k.ours OR j.nb IS NOT NULL))
        ) AS x"""


# The endpoints with pending messages in the claim's buckets, each with its first
# one's due time (the earliest: the index is in due order within an endpoint), in
# turn (round robin) by (bucket, endpoint) through the pending index led by the
# bucket: from the pair after (:after_bucket, :after) — the last endpoint the
# poller's previous claim took from — up, then around from the first bucket up to
# that pair (``lap`` 1), and only as far as the statement reads it: a claim that has
# its :limit rows stops walking. A step is one descent of the index to the next
# pending pair (``c``). In one of :buckets, that is the next endpoint; in another
# bucket, the walk jumps to just before the next of :buckets past it (a row with
# no due time, which ``ready`` leaves out), so a poller that leads some shards
# reads no other shard's endpoints, and empty buckets cost nothing; past the last,
# it goes around once. Through the pending index led by the endpoint, a poller
# leading a shard of 8 walked past the others' endpoints (10,000 busy endpoints:
# 2.1 ms a claim, 28 ms for a shard of 256, 40 ms for an idle shard beside busy
# ones: loadtest/scopes.py). A recursive CTE (the statement says WITH RECURSIVE)
# named ``pending``; every row carries the cursor (ab, ae) and the greatest bigint.
PENDING_IN_TURN = f"""
        SELECT c.ab, c.ae, CAST(NULL AS timestamptz), 0, c.ab, c.ae, 9223372036854775807
        FROM (SELECT CAST(:after_bucket AS smallint) AS ab, CAST(:after AS bigint) AS ae) AS c
        UNION ALL
        SELECT x.*, p.ab, p.ae, p.top
        FROM pending p
        CROSS JOIN LATERAL (
            (SELECT o.bucket AS b, o.endpoint_id AS id, o.next_attempt_at AS due
             FROM poller_outbox o
             WHERE o.status = 'pending' AND (o.bucket, o.endpoint_id) > (p.b, p.id)
             ORDER BY o.bucket, o.endpoint_id, o.next_attempt_at
             LIMIT 1)
            UNION ALL
            SELECT NULL, NULL, NULL  -- none: a row of NULLs, to go around or end
            LIMIT 1
        ) AS c
        {bucket_step("p", "c.b, c.id, c.due", ", NULL")}
    """

# Claim up to :limit due rows of the given buckets, fairly between endpoints.
# The endpoints considered are those with pending messages in the claim's buckets,
# in turn (PENDING_IN_TURN: from the one after (:after_bucket, :after), the last the
# poller's previous claim took from, around), and only until the claim has its
# rows: most of a product's customers have nothing due at a given moment, and a claim that
# visited all of 10,000 idle endpoints took 15-24 ms, one that visited 10,000
# with messages 12 ms (45 ms walking them all), where this takes 0.9. Each
# claimed row's endpoint updated_at is read by its key, so no plan joins the
# whole endpoints table.
# Each enabled endpoint gets at most its free in-flight room (its max_in_flight
# minus what this poller already holds for it, given as JSON); each one's rows
# come, oldest due first, from its own partial index. So one endpoint's backlog,
# or a slow endpoint at its cap, never starves the others (each claim starts
# where the last one stopped; an endpoint at its cap is passed), and a disabled
# endpoint's rows wait, and so do the rows of one an operator paused (held_by, held_until:
# poller/operate/cancel.py), and those of a tenant that holds its ceiling of deliveries in
# this poller (:full_tenants, POLLER_TENANT_MAX_IN_FLIGHT). So do a paused
# endpoint's (paused_until: its circuit is not closed, or it answered 429/503 with
# Retry-After) and a rate-limited one's:
# CLAIM_GOVERNED (poller/store/queries/health.py) takes those, at most ten times a
# second, so this statement only reads two more columns of each endpoint.
# Each row comes back with its endpoint's updated_at, so a poller notices an
# endpoint changed (new URL, secret) before it sends. SKIP LOCKED lets pollers
# share a shard without waiting on each other. Attempts are counted here, at
# claim time, so a message that kills its poller still runs out of attempts;
# one new claim_token per batch fences every later write for these attempts;
# the lease is measured on the database clock.
#
# With :fences (JSON [{shard, fence}], else NULL) the statement first checks and
# advances each shard's fence as FENCE_SHARDS does (poller/store/queries/cluster.py),
# and claims only from the shards it accepted (bucket % :shards): one statement,
# so the claim path can run it on its own with no transaction around it. The
# accepted shards come back in the last column, ``accepted``, on every row (and
# on a row of NULLs when nothing was claimed).
#
# The claim connection plans this once for all values (poller/store/db.py), so the UPDATE
# finds its rows by the ids' array, through the primary key: joined to ``due``
# (guessed at 200 rows, whatever :limit is) it read the whole outbox of a
# one-endpoint backlog to find them (20,000 due rows: 3.3 ms a claim where this
# takes 0.5; 1,000,000: 129 ms). The rows come back in ``due``'s order.
CLAIM_BATCH = _statement(
    "CLAIM_BATCH",
    f"""
    WITH RECURSIVE offered AS ({OFFERED_FENCES}), fenced AS (
        {fencing("claimed_by")}
    ), busy AS MATERIALIZED (
        SELECT * FROM jsonb_to_recordset(CAST(:in_flight AS jsonb))
            AS b(endpoint_id bigint, n integer)
    ), pending (b, id, due, lap, ab, ae, top) AS (
        {PENDING_IN_TURN}), ready AS (
        -- each walked endpoint read by its id, in the walk's order (a LATERAL with a
        -- LIMIT: a join let the plan read the endpoints first, in id order, and take
        -- the same endpoint first in every claim)
        SELECT r.* FROM pending p
        CROSS JOIN LATERAL (
            SELECT e.id, p.b,
                   coalesce(e.max_in_flight, CAST(:default_max_in_flight AS integer))
                       - coalesce((SELECT busy.n FROM busy WHERE busy.endpoint_id = e.id), 0)
                       AS room
            FROM poller_endpoints e
            WHERE e.id = p.id AND p.due <= now()
              AND e.enabled
              AND (CAST(:fences AS jsonb) IS NULL
                   OR e.bucket % CAST(:shards AS integer) IN (SELECT shard FROM fenced))
              AND (e.held_by IS NULL OR e.held_until <= now())
              AND e.rate_limit IS NULL AND (e.paused_until IS NULL OR e.paused_until <= now())
              AND (e.tenant IS NULL OR e.tenant <> ALL(CAST(:full_tenants AS text[])))
            LIMIT 1
        ) AS r
    ), due AS (
        SELECT picked.id
        FROM ready
        CROSS JOIN LATERAL (
            SELECT o.id FROM poller_outbox o
            WHERE o.bucket = ready.b AND o.endpoint_id = ready.id
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
    ), queue AS (
        SELECT ARRAY(SELECT id FROM due) AS ids
    ), claimed AS (
        UPDATE poller_outbox o
        {CLAIMING}
        FROM token
        WHERE o.id = ANY(CAST((SELECT ids FROM queue) AS bigint[]))
        RETURNING {CLAIMED}, false AS probe, o.probe_refunds, false AS expired
    )
    SELECT claimed.*, f.accepted
    FROM (SELECT array_agg(shard) AS accepted FROM fenced) AS f
    LEFT JOIN claimed ON true
    ORDER BY array_position((SELECT ids FROM queue), claimed.id)
    """,
)

# The endpoints of just-claimed messages that the poller's cache lacks or holds an
# older version of (url, secrets, limits): read in the claim's transaction, or right
# after a claim made on its own (poller/rows/claims.py).
ENDPOINTS_BY_ID = _statement(
    "ENDPOINTS_BY_ID",
    "SELECT * FROM poller_endpoints WHERE id = ANY(CAST(:ids AS bigint[]))",
)

# Claim-lease heartbeat: extend the leases of rows this poller is still working
# on (delivering, or writing the outcome of), one statement for all of them.
# Fenced by claim token: a row reclaimed meanwhile is neither extended nor returned.
# A row someone else holds locked (an operator's open UPDATE or DELETE, an
# application's transaction) is skipped, never waited for: it comes back with
# ``extended`` false when its committed version is still this claim's, for the next
# beat — so one held row cannot hold back the leases of all the others.
# The rows are found by the ids' array, through the primary key: a plan made while
# the outbox was analyzed empty walked the whole key to join them to the pairs.
EXTEND_CLAIMS = _statement(
    "EXTEND_CLAIMS",
    """
    WITH h AS (
        SELECT * FROM unnest(CAST(:ids AS bigint[]), CAST(:tokens AS bigint[]))
            AS h(id, claim_token)
    ), locked AS (
        SELECT o.id FROM poller_outbox o
        WHERE o.id = ANY(CAST(:ids AS bigint[])) AND o.status = 'in_flight'
          AND (o.id, o.claim_token) IN (SELECT id, claim_token FROM h)
        FOR NO KEY UPDATE SKIP LOCKED
    ), extended AS (
        UPDATE poller_outbox o
        SET claim_expires_at = now()
            + make_interval(secs => CAST(:claim_lease AS double precision))
        WHERE o.id = ANY(ARRAY(SELECT id FROM locked))
        RETURNING o.id
    )
    SELECT id, true AS extended FROM extended
    UNION ALL
    SELECT o.id, false FROM poller_outbox o
    WHERE o.id = ANY(CAST(:ids AS bigint[])) AND o.status = 'in_flight'
      AND (o.id, o.claim_token) IN (SELECT id, claim_token FROM h)
      AND o.id NOT IN (SELECT id FROM locked)
    """,
)

# Apply a batch of outcomes, each fenced by (id, claim_token, in_flight): a
# write from a superseded claim matches no row and changes nothing. The batch
# is one JSON array of arrays (poller/rules/outcomes.py outcomes_json: a column per
# position, nulls for what is absent): json.dumps is several times cheaper than
# adapting fifteen parallel arrays, and arrays than objects. The status, retry
# delay, lookup flag and refund are decided by the caller (poller/rows/completions.py) from
# the claimed row; this statement only applies them (counting refunds: a
# failed probe's in probe_refunds, poller/rules/health.py) and records each attempt
# that reached the wire in poller_delivery_attempts — stale ones too, marked
# stale, so every duplicate the receiver saw is explained. The rows are found by
# the ids' array through the primary key: the plan otherwise read every entry of
# the in-flight index, dead ones too, to pick the batch's rows out of it.
#
# One job: it locks nothing but its outcomes' outbox rows, and those with
# SKIP LOCKED: a row someone else holds locked (an operator's open
# UPDATE or DELETE of an endpoint's rows, an application's transaction) comes back
# with status 'busy' — neither applied nor recorded — and the caller writes it
# again later (poller/rows/completions.py), so one held row never makes the others'
# completion wait. FOR NO KEY UPDATE: what the UPDATE takes anyway (no key column
# changes), and it keeps the row for a stale outcome's attempt record, whose
# foreign key check would otherwise wait on a DELETE in progress.
# What follows from a completion — the endpoint's health (JUDGE_HEALTH), a
# key handed on (ADVANCE_KEYS) — are later statements that skip rows someone
# else holds, so no application or operator transaction can make it wait.
# Each row says whether its endpoint's health row (read, never locked) is one
# JUDGE_HEALTH would leave alone after deliveries only (``healthy``: closed, no
# failure streak, a success within the second), and ``backlog`` whether signals
# wait in poller_health_backlog: with both, a completion of deliveries skips
# JUDGE_HEALTH, which would change nothing (poller/rows/completions.py).
COMPLETE_BATCH = _statement(
    "COMPLETE_BATCH",
    """
    WITH c AS (
        SELECT CAST(r->>0 AS bigint) AS id, CAST(r->>1 AS bigint) AS claim_token,
               CAST(r->>2 AS integer) AS attempt, r->>3 AS status, r->>4 AS outcome,
               CAST(r->>5 AS double precision) AS retry_delay,
               CAST(r->>6 AS boolean) AS needs_lookup, CAST(r->>7 AS integer) AS refund,
               r->>8 AS kind, CAST(r->>9 AS boolean) AS probe,
               CAST(r->>10 AS integer) AS status_code, r->>11 AS error_class,
               r->>12 AS error_message, CAST(r->>13 AS double precision) AS duration_ms,
               r->>14 AS response_excerpt,
               TIMESTAMPTZ 'epoch' + CAST(r->>15 AS bigint) * INTERVAL '1 microsecond'
                   AS started_at
        FROM jsonb_array_elements(CAST(:outcomes AS jsonb)) AS r
    ), locked AS (
        SELECT o.id FROM poller_outbox o
        WHERE o.id = ANY(ARRAY(SELECT id FROM c))
        FOR NO KEY UPDATE SKIP LOCKED
    ), done AS (
        UPDATE poller_outbox o
        SET status = c.status,
            attempts = o.attempts - coalesce(c.refund, 0),
            refunds = o.refunds + CASE WHEN c.probe THEN 0 ELSE coalesce(c.refund, 0) END,
            probe_refunds = o.probe_refunds + CASE WHEN c.probe THEN coalesce(c.refund, 0)
                                                   ELSE 0 END,
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
        WHERE o.id = ANY(ARRAY(SELECT id FROM locked))
          AND o.id = c.id AND o.claim_token = c.claim_token AND o.status = 'in_flight'
        RETURNING o.id, o.endpoint_id, o.status, o.ordering_key
    ), recorded AS (
        INSERT INTO poller_delivery_attempts
            (message_id, endpoint_id, attempt, kind, claim_token, poller_id, started_at,
             duration_ms, outcome, status_code, error_class, error_message, response_excerpt,
             stale)
        SELECT * FROM (
            SELECT c.id,
                   -- a stale outcome's message only is looked up, a row at a time (a
                   -- join of them all was a scan of the outbox per completion while it
                   -- was small); one that is gone (purged, deleted) records nothing
                   coalesce(d.endpoint_id,
                            (SELECT x.endpoint_id FROM poller_outbox x WHERE x.id = c.id))
                       AS endpoint_id,
                   c.attempt, c.kind, c.claim_token, CAST(:poller_id AS text), c.started_at,
                   c.duration_ms, c.outcome, c.status_code, c.error_class, c.error_message,
                   c.response_excerpt, d.id IS NULL
            FROM c
            LEFT JOIN done d ON d.id = c.id
            WHERE c.kind IS NOT NULL AND c.id IN (SELECT id FROM locked)
        ) AS a
        WHERE a.endpoint_id IS NOT NULL
    )
    SELECT d.id, d.endpoint_id, d.status, d.ordering_key,
           h.state = 'closed' AND h.consecutive_failures = 0
               AND h.last_success_at >= now() - interval '1 second' AS healthy,
           EXISTS (SELECT 1 FROM poller_health_backlog) AS backlog
    FROM done d
    LEFT JOIN poller_endpoint_health h ON h.endpoint_id = d.endpoint_id
    UNION ALL
    SELECT x.id, NULL, 'busy', NULL, NULL, NULL FROM poller_outbox x
    WHERE x.id = ANY(ARRAY(SELECT id FROM c WHERE id NOT IN (SELECT id FROM locked)))
    """,
)

# After COMPLETE_BATCH, in its transaction: what the applied sends tell each
# endpoint's health (poller/rules/health.py), given per endpoint by the caller (ok:
# deliveries; bad: failed requests — no answer, 5xx, 408, 429, probes and
# lookups alike, whatever the message's attempt budget; the longest pause; a
# 410's reason; the last error). A delivery closes the circuit and resets the
# count; the endpoint's circuit_failures (else :circuit_failures) bad in a
# row — or a failed probe — open it for a cool-down that doubles on each
# failed probe, up to :circuit_cooldown_max. An endpoint row changes only on a
# transition: paused_until (CIRCUIT_HOLD while the circuit is not closed; a
# Retry-After's end after 429/503), and disabled after 410 Gone or after
# failing for :disable_after seconds without a success.
#
# The health and endpoint rows are locked with SKIP LOCKED (FOR NO KEY UPDATE:
# an enqueue's foreign-key check on the endpoint does not conflict), in
# endpoint order, and judged from their locked (newest) version, so concurrent
# completions neither deadlock nor lose counts, and an operator's transaction
# on an endpoint never makes a completion wait: the signals of an endpoint
# whose rows are busy go to poller_health_backlog, in this transaction, and
# whichever JUDGE_HEALTH next locks that endpoint folds them in (the
# maintenance sweep runs it with no signals of its own for that). A healthy
# endpoint's row is written at most about once a second. What changed comes
# back as ``events`` (on one row) for operational events.
JUDGE_HEALTH = _statement(
    "JUDGE_HEALTH",
    """
    WITH fresh AS (
        SELECT * FROM jsonb_to_recordset(CAST(:signals AS jsonb)) AS s(
            endpoint_id bigint, ok integer, bad integer, pause double precision,
            gone text, error text)
    ), wanted AS (
        SELECT s.endpoint_id FROM fresh s
        JOIN poller_endpoint_health h ON h.endpoint_id = s.endpoint_id
        WHERE s.bad > 0 OR s.pause IS NOT NULL OR s.gone IS NOT NULL OR h.state <> 'closed'
           OR h.consecutive_failures > 0 OR h.last_success_at IS NULL
           OR h.last_success_at < now() - interval '1 second'
        UNION
        SELECT endpoint_id FROM poller_health_backlog
    ), locked AS (
        SELECT h.endpoint_id FROM poller_endpoint_health h
        JOIN poller_endpoints e ON e.id = h.endpoint_id
        WHERE h.endpoint_id IN (SELECT endpoint_id FROM wanted)
        ORDER BY h.endpoint_id
        FOR NO KEY UPDATE OF h, e SKIP LOCKED
    ), folded AS (
        DELETE FROM poller_health_backlog b
        WHERE b.endpoint_id IN (SELECT endpoint_id FROM locked)
        RETURNING b.endpoint_id, b.ok, b.bad, b.pause, b.gone, b.error
    ), deferred AS (
        INSERT INTO poller_health_backlog (endpoint_id, ok, bad, pause, gone, error)
        SELECT s.endpoint_id, s.ok, s.bad, s.pause, s.gone, s.error FROM fresh s
        WHERE s.endpoint_id IN (SELECT endpoint_id FROM wanted)
          AND s.endpoint_id NOT IN (SELECT endpoint_id FROM locked)
        RETURNING endpoint_id
    ), signals AS (
        SELECT x.endpoint_id, sum(x.ok) AS ok, sum(x.bad) AS bad, max(x.pause) AS pause,
               max(x.gone) AS gone,
               coalesce(max(x.error) FILTER (WHERE x.fresh), max(x.error)) AS error
        FROM (SELECT f.*, true AS fresh FROM fresh f
              WHERE f.endpoint_id IN (SELECT endpoint_id FROM locked)
              UNION ALL
              SELECT b.*, false FROM folded b) AS x
        GROUP BY x.endpoint_id
    ), judged AS (
        SELECT s.endpoint_id, s.ok, s.bad, s.pause, s.gone, s.error, h.state AS was,
               s.ok = 0 AND s.bad > 0
                 AND (h.state = 'half_open'
                      OR (h.state = 'closed'
                          AND coalesce(e.circuit_failures, CAST(:circuit_failures AS integer)) > 0
                          AND h.consecutive_failures + s.bad
                              >= coalesce(e.circuit_failures,
                                          CAST(:circuit_failures AS integer)))) AS opens,
               CASE WHEN h.state = 'half_open'
                    THEN least(coalesce(h.cooldown, 0) * 2,
                               CAST(:circuit_cooldown_max AS double precision))
                    ELSE coalesce(e.circuit_cooldown, CAST(:circuit_cooldown AS double precision))
               END AS next_cooldown,
               e.enabled AND (s.gone IS NOT NULL
                   OR (s.ok = 0 AND s.bad > 0 AND CAST(:disable_after AS double precision) > 0
                       AND coalesce(h.failing_since, now()) <= now()
                           - make_interval(secs => CAST(:disable_after AS double precision))))
                   AS disables,
               h.failing_since
        FROM signals s
        JOIN poller_endpoint_health h ON h.endpoint_id = s.endpoint_id
        JOIN poller_endpoints e ON e.id = s.endpoint_id
    ), health AS (
        UPDATE poller_endpoint_health h
        SET consecutive_failures = CASE WHEN j.ok > 0 THEN 0
                                        ELSE h.consecutive_failures + j.bad END,
            failed_requests = h.failed_requests + j.bad,
            last_success_at = CASE WHEN j.ok > 0 THEN now() ELSE h.last_success_at END,
            last_failure_at = CASE WHEN j.bad > 0 THEN now() ELSE h.last_failure_at END,
            failing_since = CASE WHEN j.ok > 0 THEN NULL
                                 WHEN j.bad > 0 THEN coalesce(h.failing_since, now())
                                 ELSE h.failing_since END,
            last_error = CASE WHEN j.bad > 0 THEN j.error ELSE h.last_error END,
            state = CASE WHEN j.ok > 0 THEN 'closed' WHEN j.opens THEN 'open' ELSE h.state END,
            cooldown = CASE WHEN j.ok > 0 THEN NULL WHEN j.opens THEN j.next_cooldown
                            ELSE h.cooldown END,
            opened_at = CASE WHEN j.opens AND h.state = 'closed' THEN now()
                             WHEN j.ok > 0 THEN NULL ELSE h.opened_at END,
            open_until = CASE WHEN j.opens THEN now() + make_interval(secs => j.next_cooldown)
                              WHEN j.ok > 0 THEN NULL ELSE h.open_until END,
            opens = h.opens + CASE WHEN j.opens AND h.state = 'closed' THEN 1 ELSE 0 END
        FROM judged j
        WHERE h.endpoint_id = j.endpoint_id
        RETURNING h.endpoint_id, j.was, h.state, h.consecutive_failures, h.cooldown,
                  j.disables, j.gone, j.error, j.failing_since
    ), endpoint AS (
        UPDATE poller_endpoints e
        SET paused_until = CASE
                WHEN j.opens THEN CAST('{HOLD}' AS timestamptz)
                WHEN j.ok > 0 AND j.was <> 'closed' THEN NULL
                WHEN j.pause IS NOT NULL AND coalesce(e.paused_until < '{HOLD}', true)
                    THEN greatest(coalesce(e.paused_until, now()),
                                  now() + make_interval(secs => j.pause))
                ELSE e.paused_until END,
            enabled = e.enabled AND NOT j.disables,
            disabled_reason = CASE WHEN NOT j.disables THEN e.disabled_reason
                WHEN j.gone IS NOT NULL THEN j.gone
                ELSE 'failing since ' || CAST(CAST(j.failing_since AT TIME ZONE 'UTC'
                                                AS timestamp(0)) AS text) || ' UTC with no '
                     || 'success (POLLER_DISABLE_AFTER): last error ' || coalesce(j.error, '?')
                END,
            updated_at = CASE WHEN j.disables THEN now() ELSE e.updated_at END
        FROM judged j
        WHERE e.id = j.endpoint_id
          AND (j.opens OR j.disables OR j.pause IS NOT NULL
               OR (j.ok > 0 AND j.was <> 'closed'))
        RETURNING e.id
    )
    SELECT (SELECT json_agg(json_build_object(
                'endpoint_id', health.endpoint_id, 'was', health.was, 'state', health.state,
                'failures', health.consecutive_failures, 'cooldown', health.cooldown,
                'disabled', health.disables, 'gone', health.gone IS NOT NULL,
                'error', health.error))
            FROM health
            WHERE health.was <> health.state OR health.disables) AS events,
           (SELECT count(*) FROM endpoint) AS endpoints_changed,
           (SELECT count(*) FROM deferred) AS deferred
    """.replace("{HOLD}", CIRCUIT_HOLD),
)

# Reclaim claims whose lease expired (their poller died or stalled): back to
# pending with needs_lookup (the send may have happened), or failed when the
# attempt budget is spent. SKIP LOCKED: never waits on, or deadlocks with, a
# completion racing for the same row — that row is left for the next sweep.
# The UPDATE finds the locked rows by their ids' array (as EXTEND_CLAIMS does).
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
        WHERE o.id = ANY(ARRAY(SELECT id FROM expired))
        RETURNING o.id, o.endpoint_id, o.status, o.attempts, o.claim_token, o.claimed_by
    ), recorded AS (
        INSERT INTO poller_delivery_attempts
            (message_id, endpoint_id, attempt, kind, claim_token, poller_id, outcome,
             error_class, error_message)
        SELECT id, endpoint_id, attempts, 'send', claim_token, claimed_by, 'lease_expired',
               'ClaimLeaseExpired', 'claim lease expired before the poller completed'
        FROM reclaimed
    )
    SELECT id, status FROM reclaimed
    """,
)
