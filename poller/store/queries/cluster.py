"""Statements of election and shards, and the schema revision."""

from __future__ import annotations

from poller.store.queries._registry import statement as _statement

# --- election and shards ---------------------------------------------------------

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
# until the claim commits. CLAIM_BATCH does the same in its own statement.
OFFERED_FENCES = (
    "SELECT * FROM jsonb_to_recordset(CAST(:fences AS jsonb)) AS x(shard integer, fence bigint)"
)


def fencing(holder: str) -> str:
    """The fence check and advance of the ``offered`` rows, ``:holder`` the poller's name."""
    return f"""UPDATE poller_shard_fences f
    SET fence = offered.fence, holder = :{holder}, updated_at = now()
    FROM offered
    WHERE f.shard = offered.shard
      AND (f.fence < offered.fence
           OR (f.fence = offered.fence AND f.holder IS NOT DISTINCT FROM :{holder}))
    RETURNING f.shard"""


FENCE_SHARDS = _statement(
    "FENCE_SHARDS",
    f"""
    WITH offered AS ({OFFERED_FENCES})
    {fencing("holder")}
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
