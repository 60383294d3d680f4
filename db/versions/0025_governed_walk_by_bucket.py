"""the governed claim walks the governed endpoints by bucket

* ``poller_endpoint_health.bucket``: its endpoint's bucket, written by the trigger
  that makes the row (and kept by one on an update of the endpoint's bucket, which
  only plain SQL can make);
* ``ix_poller_endpoints_rate_limited`` (bucket, id) and
  ``ix_poller_endpoint_health_not_closed`` (bucket, endpoint_id) replace the two
  indexes of 0023, which had no bucket.

The governed claim walked the governed endpoints in id order: a poller leading
some shards walked past the others' (with every endpoint of 10,000 rate limited,
a shard of 256 found at most 4 endpoints a claim, its walk's bound of 1,000 spent
on other shards). It now walks its own buckets' only, as the plain claim does
since 0024. Both tables hold a row per endpoint: the column and the indexes are
written in moments, under a lock that endpoint writes wait for meanwhile.
Pollers of the version before stop first: their governed claim walks by id,
which these indexes do not serve.

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None

# Every endpoint has its health row, however it was made (the API or plain SQL),
# with the endpoint's bucket.
HEALTH_FUNCTION = """
CREATE OR REPLACE FUNCTION poller_endpoints_health() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO poller_endpoint_health (endpoint_id, bucket) VALUES (NEW.id, NEW.bucket)
    ON CONFLICT (endpoint_id) DO UPDATE SET bucket = EXCLUDED.bucket;
    RETURN NEW;
END
$$
"""
BUCKET_TRIGGER = """
CREATE TRIGGER poller_endpoints_health_bucket AFTER UPDATE OF bucket ON poller_endpoints
FOR EACH ROW WHEN (OLD.bucket IS DISTINCT FROM NEW.bucket)
EXECUTE FUNCTION poller_endpoints_health()
"""
OLD_HEALTH_FUNCTION = """
CREATE OR REPLACE FUNCTION poller_endpoints_health() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO poller_endpoint_health (endpoint_id) VALUES (NEW.id) ON CONFLICT DO NOTHING;
    RETURN NEW;
END
$$
"""


def upgrade() -> None:
    op.add_column("poller_endpoint_health", sa.Column("bucket", sa.SmallInteger()))
    op.execute(HEALTH_FUNCTION)  # before the backfill: no row is made without a bucket
    op.execute(BUCKET_TRIGGER)
    op.execute(
        "UPDATE poller_endpoint_health h SET bucket = e.bucket"
        " FROM poller_endpoints e WHERE e.id = h.endpoint_id"
    )
    op.alter_column("poller_endpoint_health", "bucket", nullable=False)
    op.drop_index("ix_poller_endpoints_rate_limited", table_name="poller_endpoints")
    op.create_index(
        "ix_poller_endpoints_rate_limited",
        "poller_endpoints",
        ["bucket", "id"],
        unique=False,
        postgresql_where=sa.text("rate_limit IS NOT NULL"),
    )
    op.drop_index("ix_poller_endpoint_health_not_closed", table_name="poller_endpoint_health")
    op.create_index(
        "ix_poller_endpoint_health_not_closed",
        "poller_endpoint_health",
        ["bucket", "endpoint_id"],
        unique=False,
        postgresql_where=sa.text("state <> 'closed'"),
    )


def downgrade() -> None:
    op.drop_index("ix_poller_endpoint_health_not_closed", table_name="poller_endpoint_health")
    op.create_index(
        "ix_poller_endpoint_health_not_closed",
        "poller_endpoint_health",
        ["endpoint_id"],
        unique=False,
        postgresql_where=sa.text("state <> 'closed'"),
    )
    op.drop_index("ix_poller_endpoints_rate_limited", table_name="poller_endpoints")
    op.create_index(
        "ix_poller_endpoints_rate_limited",
        "poller_endpoints",
        ["id"],
        unique=False,
        postgresql_where=sa.text("rate_limit IS NOT NULL"),
    )
    op.execute("DROP TRIGGER poller_endpoints_health_bucket ON poller_endpoints")
    op.execute(OLD_HEALTH_FUNCTION)
    op.drop_column("poller_endpoint_health", "bucket")
