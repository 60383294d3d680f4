"""Statements of endpoint health (poller/rules/health.py): governed claims, health reports.

A *governed* endpoint is one the plain claim statement skips: rate limited, or
with a circuit that is not closed. Its messages are claimed here, just before
CLAIM_BATCH (each checks the shard fences itself, or both follow FENCE_SHARDS
in one transaction), at most ten times a second, so the hot path pays nothing
for endpoints that are neither.
"""

from __future__ import annotations

from poller.store.queries._registry import statement as _statement
from poller.store.queries.claims import CLAIMED, CLAIMING, bucket_step
from poller.store.queries.cluster import OFFERED_FENCES, fencing

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
# are locked and written (their tokens spent, a probe's state). Every governed
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
    ), spent AS (
        UPDATE poller_endpoint_health h
        SET tokens = CASE WHEN a.rate_limit IS NULL THEN h.tokens
                          ELSE a.tokens - coalesce(t.n, 0) END,
            tokens_at = CASE WHEN a.rate_limit IS NULL THEN h.tokens_at ELSE now() END,
            state = CASE WHEN a.probing AND t.n > 0 THEN 'half_open' ELSE h.state END,
            probe_at = CASE WHEN a.probing AND t.n > 0 THEN now() ELSE h.probe_at END,
            probes = h.probes + CASE WHEN a.probing AND t.n > 0 THEN 1 ELSE 0 END
        FROM allow a
        LEFT JOIN taken t ON t.endpoint_id = a.id
        WHERE h.endpoint_id = a.id
        RETURNING h.endpoint_id
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
    CROSS JOIN (SELECT array_agg(shard) AS accepted FROM fenced) AS f
    LEFT JOIN claimed ON true
    """,
)

# ``poller endpoints health`` and the dashboard's endpoints: each endpoint's (or
# one's) health, with its send success ratio over the last hour and day (from the
# attempt history, found by the BRIN index on finished_at), its pending messages
# and its rate limit's tokens now. A page of them, by name: at most :limit (NULL:
# all) after :after (NULL: from the first), whose names contain :contains (NULL:
# any); the attempts and pending messages are counted for that page's endpoints
# only, each in one pass. Counted per endpoint, over 10,000 endpoints, the pending
# messages took 1.06 s (a plan that believed one endpoint had them all read the
# outbox for each), and the dashboard's page of all of them 0.9 s and 6.5 MB.
HEALTH_REPORT = _statement(
    "HEALTH_REPORT",
    """
    WITH page AS (
        SELECT e.id, e.bucket FROM poller_endpoints e
        WHERE (CAST(:name AS text) IS NULL OR e.name = CAST(:name AS text))
          AND (CAST(:after AS text) IS NULL OR e.name > CAST(:after AS text))
          AND (CAST(:contains AS text) IS NULL
               OR strpos(e.name, CAST(:contains AS text)) > 0)
        ORDER BY e.name
        LIMIT CAST(:limit AS bigint)
    )
    SELECT e.id, e.name, e.enabled, e.disabled_reason, e.rate_limit,
           coalesce(e.rate_burst, CAST(greatest(1, ceil(e.rate_limit)) AS integer)) AS rate_burst,
           e.circuit_failures, e.circuit_cooldown, e.paused_until, e.held_until, e.held_by,
           h.state, h.consecutive_failures, h.cooldown, h.opened_at, h.open_until, h.probe_at,
           h.opens, h.probes, h.last_success_at, h.last_failure_at, h.failing_since,
           h.last_error,
           CASE WHEN e.rate_limit IS NOT NULL THEN least(
               CAST(coalesce(e.rate_burst, greatest(1, ceil(e.rate_limit))) AS double precision),
               h.tokens + e.rate_limit * extract(epoch FROM now() - h.tokens_at)) END AS tokens,
           coalesce(s.sends_1h, 0) AS sends_1h, coalesce(s.ok_1h, 0) AS ok_1h,
           coalesce(s.sends_24h, 0) AS sends_24h, coalesce(s.ok_24h, 0) AS ok_24h,
           coalesce(p.pending, 0) AS pending
    FROM page
    JOIN poller_endpoints e ON e.id = page.id
    JOIN poller_endpoint_health h ON h.endpoint_id = e.id
    LEFT JOIN (
        -- One pass over the day's attempts (the BRIN index on finished_at), no join
        -- per endpoint: a lateral join per endpoint through the outbox took 8 s
        -- with 100 endpoints and 200,000 attempts a day.
        SELECT a.endpoint_id,
               count(*) FILTER (WHERE a.finished_at > now() - interval '1 hour') AS sends_1h,
               count(*) FILTER (WHERE a.finished_at > now() - interval '1 hour'
                                  AND a.outcome = 'delivered') AS ok_1h,
               count(*) AS sends_24h,
               count(*) FILTER (WHERE a.outcome = 'delivered') AS ok_24h
        FROM poller_delivery_attempts a
        WHERE a.kind = 'send' AND NOT a.stale AND a.finished_at > now() - interval '24 hours'
          AND a.endpoint_id IN (SELECT id FROM page)
        GROUP BY a.endpoint_id
    ) AS s ON s.endpoint_id = e.id
    LEFT JOIN (
        SELECT o.endpoint_id, count(*) AS pending
        FROM poller_outbox o
        WHERE o.status = 'pending' AND (o.bucket, o.endpoint_id) IN (SELECT bucket, id FROM page)
        GROUP BY o.endpoint_id
    ) AS p ON p.endpoint_id = e.id
    ORDER BY e.name
    """,
)

# ``endpoints enable``: a re-enabled endpoint starts afresh — circuit closed, no
# failure streak, no pause — so its backlog drains at once.
RESET_HEALTH = _statement(
    "RESET_HEALTH",
    """
    WITH e AS (
        UPDATE poller_endpoints SET paused_until = NULL
        WHERE id = CAST(:endpoint_id AS bigint)
        RETURNING id
    )
    UPDATE poller_endpoint_health
    SET state = 'closed', consecutive_failures = 0, cooldown = NULL, opened_at = NULL,
        open_until = NULL, probe_at = NULL, failing_since = NULL
    WHERE endpoint_id = CAST(:endpoint_id AS bigint)
    """,
)
