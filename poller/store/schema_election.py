"""The election's tables: shard fences, the postgres backend's leases and members, and
what every poller must agree on (docs/explanation/election.md). On poller/store/schema.py's
one metadata (Alembic migrates them all: db/env.py imports this module too), apart
from the delivery tables: only the election and the claim's fences read them.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, DateTime, Integer, Table, Text, func, text

from poller.store.schema import metadata

# The last fence PostgreSQL accepted for each shard. A claim under a smaller
# fence comes from a superseded leader and is refused (poller/rows/claims.py).
shard_fences = Table(
    "poller_shard_fences",
    metadata,
    Column("shard", Integer, primary_key=True),
    Column("fence", BigInteger, nullable=False, server_default=text("0")),
    Column("holder", Text),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)

# Leases of the postgres election backend, on the database clock.
leases = Table(
    "poller_leases",
    metadata,
    Column("key", Text, primary_key=True),
    Column("holder", Text, nullable=False),
    Column("fence", BigInteger, nullable=False),
    Column("expires_at", DateTime(timezone=True), nullable=False),
)

# Live pollers (heartbeats) of the postgres election backend, for balancing.
members = Table(
    "poller_members",
    metadata,
    Column("poller_id", Text, primary_key=True),
    Column("expires_at", DateTime(timezone=True), nullable=False),
)

# Cluster-wide facts every poller must agree on, e.g. the number of shards.
cluster = Table(
    "poller_cluster",
    metadata,
    Column("key", Text, primary_key=True),
    Column("value", Text, nullable=False),
)
