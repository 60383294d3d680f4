"""Statements of the claim path: claim, heartbeat, complete, reclaim — and the governed claim.

A *governed* endpoint is one the plain claim statement skips: rate limited, or
with a circuit that is not closed. Its messages are claimed by CLAIM_GOVERNED, just
before CLAIM_BATCH (each checks the shard fences itself, or both follow FENCE_SHARDS
in one transaction), at most ten times a second, so the hot path pays nothing
for endpoints that are neither. What a completion tells an endpoint's health is
health.py's (JUDGE_HEALTH).
"""

from __future__ import annotations

from poller.store.queries._registry import statement as _statement
from poller.store.queries.cluster import OFFERED_FENCES, fencing

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
# CLAIM_GOVERNED (below) takes those, at most ten times a
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


# --- governed claims (rate limits, circuits: poller/rules/health.py) ---------------

GOVERNED_WALK = 1000
"""Steps a governed claim's walk takes at most (in turn, from where the last one
stopped): a bound on its reads where thousands are rate limited and few have a
token. A step is a governed endpoint of the claim's buckets, or a jump past
buckets that are not."""

# The governed endpoints in turn, by (bucket, endpoint): from the pair after
# (:gafter_bucket, :gafter) — where the poller's last governed claim stopped — up,
# then around from the first bucket up to that pair (``lap`` 1), at most
# GOVERNED_WALK steps, and only as far as the statement reads them (as CLAIM_BATCH's
# PENDING_IN_TURN). A step is one descent of each one's partial index, both led by
# the bucket (rate limited; a circuit not closed), to the next governed pair
# (``c``). In one of :buckets, that is the next endpoint; in another, the walk
# jumps to just before the next of :buckets past it (a row whose id is the
# greatest bigint, which no endpoint has), so a poller leading some shards reads
# no other shard's governed endpoints; past the last, it goes around once. Walked
# in id order, with every endpoint of 10,000 rate limited, a poller leading a
# shard of 256 spent the walk's bound on other shards' endpoints and found at most
# 4 a claim. A recursive CTE (the statement says WITH RECURSIVE) named ``walk``,
# whose first row (``step`` 0) is the cursor itself, not walked.
GOVERNED_IN_TURN = f"""
        SELECT c.ab, c.ae, 0, 0, c.ab, c.ae, CAST(9223372036854775807 AS bigint)
        FROM (SELECT CAST(:gafter_bucket AS smallint) AS ab,
                     CAST(:gafter AS bigint) AS ae) AS c
        UNION ALL
        SELECT x.*, w.step + 1, w.ab, w.ae, w.top
        FROM walk w
        CROSS JOIN LATERAL (
            (SELECT n.b, n.id FROM (
                (SELECT e.bucket AS b, e.id FROM poller_endpoints e
                 WHERE e.rate_limit IS NOT NULL AND (e.bucket, e.id) > (w.b, w.id)
                 ORDER BY e.bucket, e.id
                 LIMIT 1)
                UNION ALL
                (SELECT h.bucket, h.endpoint_id FROM poller_endpoint_health h
                 WHERE h.state <> 'closed' AND (h.bucket, h.endpoint_id) > (w.b, w.id)
                 ORDER BY h.bucket, h.endpoint_id
                 LIMIT 1)
             ) AS n ORDER BY n.b, n.id LIMIT 1)
            UNION ALL
            SELECT NULL, NULL  -- none: a row of NULLs, to go around or end
            LIMIT 1
        ) AS c
        {bucket_step("w")}
        WHERE w.step < {GOVERNED_WALK}
    """

# An endpoint this poller may claim from now, whatever governs it (``e``): enabled,
# in the claim's buckets and accepted shards, not held by an operator, not of a
# tenant at its ceiling in this poller (:full_tenants).
_IN_SCOPE = """e.enabled AND e.bucket = ANY(CAST(:buckets AS smallint[]))
          AND (CAST(:fences AS jsonb) IS NULL
               OR e.bucket % CAST(:shards AS integer) IN (SELECT shard FROM fenced))
          AND (e.held_by IS NULL OR e.held_until <= now())
          AND (e.tenant IS NULL OR e.tenant <> ALL(CAST(:full_tenants AS text[])))"""
# A rate-limited endpoint's tokens now (``e``, ``h``): its bucket refilled at the rate
# since it was last written, up to the burst (default one second's worth).
_TOKENS = """least(coalesce(e.rate_burst, greatest(1, ceil(e.rate_limit))),
                   h.tokens + e.rate_limit * extract(epoch FROM now() - h.tokens_at))"""

# Claim the due messages of governed endpoints in the given buckets: a rate-limited
# endpoint gets as many as its token bucket holds (rate_limit per second, up to
# rate_burst, default one second's worth), an open circuit whose cool-down has
# passed — or a half-open one whose probe ended without a verdict — gets one, the
# probe, and turns (or stays) half-open. A probe ends without a verdict when it is
# handed back unsent (a graceful shutdown, a cut connection), answered neither
# 2xx nor as a failure (a 400: the receiver is up and refusing that message) or
# reclaimed after its poller died: then no message of the endpoint is in flight,
# and the next probe goes at once (it waited two claim leases, two minutes by
# default, in every such case). Two claim leases still bound a probe that is in
# flight for good. Health rows are locked with SKIP LOCKED, so two pollers never
# spend the same tokens, and a claim never waits; two governed claims in the same
# instant may both find the probe's row not yet in flight and send two probes
# (each judged as any probe). A governed endpoint with a ``max_age`` whose first
# :limit due messages include some older than it (that need no lookup: a lookup is
# a request) gets those, flagged ``expired``, spending no token: the poller fails
# them unsent. A probing endpoint's probe goes with them: the first due message
# not past max_age (none when the first :limit are all past it, so the walk to
# find one is bounded; it was the first not among them, itself past max_age when
# more than :limit were: a probe counted that was failed unsent); a rate-limited
# endpoint's tokens go to the rest as ever. The probe
# waited until none was left at the head: under a steady feed, messages cross
# max_age between any two governed claims, and the probe never went (20 claims, 60
# aged taken, no probe): every message aged out while the feed lasted. One
# probe at a time took such a backlog, aged out behind an open circuit, one message
# per governed claim (10,000 took 17 minutes before a real probe could close the
# circuit); behind a rate limit each took a token: a backlog larger than the rate
# times max_age failed at the rate, the messages behind it aged out in turn, and
# while messages kept coming at the rate none was sent.
#
# Which governed endpoints: those that can take something now (a token and room, a
# probe due, aged messages at the head), found by walking the governed ones in turn
# by bucket (GOVERNED_IN_TURN: each one's partial index, rate limited or a circuit
# not closed, in the claim's buckets only) until :limit are found, each with its
# first pending message (one descent of the pending index). Only those health rows
# are locked; ``spend`` (on every row) says what to write to them — their tokens
# spent, a probe's state — which SPEND_TOKENS does, the second statement of the
# claim's transaction, touching no other row. Every governed
# endpoint was read, its health row locked and written, on every governed claim:
# where all of 10,000 endpoints with messages were rate limited, 97-102 ms a claim,
# ten times a second. The next governed claim starts after the last endpoint this
# one took messages from when it is full (a burst can fill it from a few endpoints:
# starting after the last one found, an endpoint whose tokens refill between claims
# took every claim), else after the last one found or walked: (``gafter_bucket``,
# ``gafter``) on every row. ``governed`` (on every row, and on a row of NULLs when
# nothing was claimed) is not 0 while governed work is due in this poller's scope —
# an endpoint taken from, or one waiting for a token or for room, or a walk that
# stopped at GOVERNED_WALK — so the caller comes back soon; ``accepted``, the shards
# whose :fences it accepted (as CLAIM_BATCH does).
#
# Planned once for all values, as CLAIM_BATCH is: the outbox is read through its
# indexes only (each walked endpoint's first pending message, the aged heads and
# the claimed rows by the ids' array), where a join or EXISTS let the plan read the
# whole outbox of a backlog; the UPDATE joins nothing (which rows are aged, which
# endpoints probe, come as arrays too): joined to its due rows, a plan made over an
# outbox analyzed after a purge walked its whole key index (7.6-11.9 ms a claim over
# 20,000 rows, against 1.3-1.9).
CLAIM_GOVERNED = _statement(
    "CLAIM_GOVERNED",
    f"""
    WITH RECURSIVE offered AS ({OFFERED_FENCES}), fenced AS (
        {fencing("claimed_by")}
    ), busy AS MATERIALIZED (
        SELECT * FROM jsonb_to_recordset(CAST(:in_flight AS jsonb))
            AS b(endpoint_id bigint, n integer)
    ), walk (b, id, lap, step, ab, ae, top) AS (
        {GOVERNED_IN_TURN}), gov AS (
        -- each walked endpoint read by its id, in the walk's order (LATERAL: a plan
        -- that hashed the walk read it whole), until :limit are found
        SELECT g.* FROM walk w
        CROSS JOIN LATERAL (
            SELECT e.id, e.bucket, w.step, e.rate_limit, h.state <> 'closed' AS probing,
                   e.max_age,
                   coalesce(e.max_in_flight, CAST(:default_max_in_flight AS integer))
                       - coalesce((SELECT busy.n FROM busy WHERE busy.endpoint_id = e.id), 0)
                       AS room,
                   CASE WHEN e.rate_limit IS NOT NULL THEN {_TOKENS} END AS tokens
            FROM poller_endpoints e
            JOIN poller_endpoint_health h ON h.endpoint_id = e.id
            CROSS JOIN LATERAL (  -- its first pending message
                SELECT o.next_attempt_at, o.created_at, o.needs_lookup FROM poller_outbox o
                WHERE o.status = 'pending' AND o.bucket = e.bucket AND o.endpoint_id = e.id
                ORDER BY o.next_attempt_at, o.id
                LIMIT 1
            ) AS f
            WHERE w.step > 0 AND e.id = w.id AND f.next_attempt_at <= now()
              AND {_IN_SCOPE}
              AND ((h.state = 'closed' AND e.rate_limit IS NOT NULL
                    AND (e.paused_until IS NULL OR e.paused_until <= now())
                    AND ((e.max_age IS NOT NULL AND NOT f.needs_lookup  -- aged at the head
                          AND extract(epoch FROM now() - f.created_at) > e.max_age)
                         OR ({_TOKENS} >= 1
                             AND coalesce(e.max_in_flight,
                                          CAST(:default_max_in_flight AS integer))
                                 > coalesce((SELECT busy.n FROM busy
                                             WHERE busy.endpoint_id = e.id), 0))))
                   OR (h.state = 'open' AND h.open_until <= now())
                   OR (h.state = 'half_open'
                       AND (NOT EXISTS (SELECT 1 FROM poller_outbox p
                                        WHERE p.endpoint_id = e.id AND p.status = 'in_flight')
                            OR h.probe_at < now() - make_interval(
                                secs => 2 * CAST(:claim_lease AS double precision)))))
            FOR UPDATE OF h SKIP LOCKED
        ) AS g
        LIMIT :limit
    ), aged AS (
        SELECT o.id, gov.id AS endpoint_id
        FROM gov
        JOIN poller_outbox o ON o.id = ANY(ARRAY(
            SELECT f.id FROM poller_outbox f
            WHERE f.bucket = gov.bucket AND f.endpoint_id = gov.id AND f.status = 'pending'
              AND f.next_attempt_at <= now()
            ORDER BY f.next_attempt_at, f.id
            LIMIT :limit
        ))
        WHERE gov.max_age IS NOT NULL
          AND o.status = 'pending' AND o.next_attempt_at <= now() AND NOT o.needs_lookup
          AND extract(epoch FROM now() - o.created_at) > gov.max_age  -- 1e308 overflows an interval
        FOR UPDATE OF o SKIP LOCKED
    ), allow AS (
        SELECT id, bucket, rate_limit, tokens, probing, max_age,
               greatest(0, least(room, CASE
                   WHEN NOT probing THEN CAST(floor(tokens) AS integer)
                   -- the first :limit due all aged: no probe among them (the next
                   -- governed claim follows these messages' outcomes at once)
                   WHEN (SELECT count(*) FROM aged WHERE aged.endpoint_id = gov.id)
                        >= :limit THEN 0
                   ELSE 1 END)) AS n
        FROM gov
    ), due AS (
        (SELECT picked.id, allow.id AS endpoint_id, false AS aged
         FROM allow
         CROSS JOIN LATERAL (
             SELECT o.id FROM poller_outbox o
             WHERE o.bucket = allow.bucket AND o.endpoint_id = allow.id
               AND o.status = 'pending'
               AND o.next_attempt_at <= now()
               AND o.id NOT IN (SELECT id FROM aged)  -- locked above: SKIP LOCKED keeps them
               AND NOT (allow.probing AND allow.max_age IS NOT NULL AND NOT o.needs_lookup
                        AND extract(epoch FROM now() - o.created_at) > allow.max_age)
             ORDER BY o.next_attempt_at, o.id
             LIMIT allow.n
             FOR UPDATE SKIP LOCKED
         ) AS picked
         WHERE allow.n > 0)
        UNION ALL
        SELECT id, endpoint_id, true FROM aged
        LIMIT :limit
    ), taken AS (
        SELECT endpoint_id, count(*) FILTER (WHERE NOT aged) AS n FROM due GROUP BY endpoint_id
    ), token AS (
        SELECT nextval('poller_claim_token_seq') AS claim_token
    ), queue AS (
        SELECT ARRAY(SELECT id FROM due) AS ids,
               ARRAY(SELECT id FROM due WHERE aged) AS aged,
               ARRAY(SELECT id FROM allow WHERE probing) AS probing
    ), claimed AS (
        UPDATE poller_outbox o
        {CLAIMING}
        FROM token
        WHERE o.id = ANY(CAST((SELECT ids FROM queue) AS bigint[]))
        RETURNING {CLAIMED},
            o.endpoint_id = ANY(CAST((SELECT probing FROM queue) AS bigint[]))
                AND o.id <> ALL(CAST((SELECT aged FROM queue) AS bigint[])) AS probe,
            o.probe_refunds,
            o.id = ANY(CAST((SELECT aged FROM queue) AS bigint[])) AS expired
    ), found AS (
        SELECT count(*) AS n, max(step) AS last FROM gov
    ), place AS (  -- where the next governed claim's walk starts after: the first of
        -- these, in this order (an Append under a LIMIT reads the next only when the
        -- one before found none: ordered, the walk was read to its end)
        -- the last endpoint taken from, when the claim is full (a rate limit's burst
        -- can fill it from a few)
        (SELECT gov.bucket AS b, gov.id FROM gov JOIN taken ON taken.endpoint_id = gov.id
         WHERE taken.n > 0 AND (SELECT count(*) FROM due) >= greatest(:limit, 1)
         ORDER BY gov.step DESC LIMIT 1)
        UNION ALL  -- the last one found, when as many were found as it takes
        SELECT gov.bucket, gov.id FROM gov, found
        WHERE found.n > 0 AND found.n >= :limit AND gov.step = found.last
        UNION ALL  -- the last one walked (the lap or its bound ended)
        (SELECT walk.b, walk.id FROM walk
         WHERE walk.step > 0 AND walk.id < walk.top ORDER BY walk.step DESC LIMIT 1)
        UNION ALL
        SELECT CAST(:gafter_bucket AS smallint), CAST(:gafter AS bigint)
        LIMIT 1
    )
    SELECT claimed.*,
           sp.spend,
           CASE WHEN found.n > 0 THEN found.n
                WHEN (SELECT max(step) FROM walk) >= {GOVERNED_WALK} THEN 1
                WHEN EXISTS (  -- one waiting for a token or for room
                    SELECT 1 FROM walk w
                    CROSS JOIN LATERAL (
                        SELECT 1 FROM poller_endpoints e
                        JOIN poller_endpoint_health h ON h.endpoint_id = e.id
                        WHERE w.step > 0 AND e.id = w.id AND h.state = 'closed'
                          AND e.rate_limit IS NOT NULL
                          AND (e.paused_until IS NULL OR e.paused_until <= now())
                          AND {_IN_SCOPE}
                          AND (SELECT o.next_attempt_at FROM poller_outbox o
                               WHERE o.status = 'pending' AND o.bucket = e.bucket
                                 AND o.endpoint_id = e.id
                               ORDER BY o.next_attempt_at, o.id
                               LIMIT 1) <= now()
                        LIMIT 1
                    ) AS waiting) THEN 1
                ELSE 0 END AS governed,
           place.b AS gafter_bucket, place.id AS gafter,
           f.accepted
    FROM found
    CROSS JOIN place
    CROSS JOIN (  -- what SPEND_TOKENS writes to the health rows locked above
        SELECT CAST(coalesce(jsonb_agg(jsonb_build_object(
                   'endpoint_id', a.id,
                   'tokens', CASE WHEN a.rate_limit IS NOT NULL
                                  THEN a.tokens - coalesce(t.n, 0) END,
                   'probed', a.probing AND coalesce(t.n, 0) > 0)), '[]') AS text) AS spend
        FROM allow a
        LEFT JOIN taken t ON t.endpoint_id = a.id
    ) AS sp
    CROSS JOIN (SELECT array_agg(shard) AS accepted FROM fenced) AS f
    LEFT JOIN claimed ON true
    """,
)

# The second step of a governed claim, in its transaction: spend what CLAIM_GOVERNED
# took (its ``spend``, one entry for each endpoint it found) on the health rows that
# statement locked (FOR UPDATE OF h SKIP LOCKED), and on no other row, so it waits on
# no one and no other poller can spend the same tokens meanwhile. A rate-limited
# endpoint's bucket, refilled to the claim's moment, less the messages taken; a
# circuit whose probe was taken turns (or stays) half-open, and counts the probe.
SPEND_TOKENS = _statement(
    "SPEND_TOKENS",
    """
    UPDATE poller_endpoint_health h
    SET tokens = coalesce(s.tokens, h.tokens),
        tokens_at = CASE WHEN s.tokens IS NULL THEN h.tokens_at ELSE now() END,
        state = CASE WHEN s.probed THEN 'half_open' ELSE h.state END,
        probe_at = CASE WHEN s.probed THEN now() ELSE h.probe_at END,
        probes = h.probes + CASE WHEN s.probed THEN 1 ELSE 0 END
    FROM jsonb_to_recordset(CAST(:spend AS jsonb))
        AS s(endpoint_id bigint, tokens double precision, probed boolean)
    WHERE h.endpoint_id = s.endpoint_id
    RETURNING h.endpoint_id
    """,
)
