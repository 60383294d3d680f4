"""Statements of endpoint health (poller/rules/health.py): what completed attempts tell
their endpoints (JUDGE_HEALTH), health reports, a reset. The governed claim, which
reads health to claim, is with the other claims (claims.py)."""

from __future__ import annotations

from poller.store.queries._registry import statement as _statement
from poller.store.schema import CIRCUIT_HOLD

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
