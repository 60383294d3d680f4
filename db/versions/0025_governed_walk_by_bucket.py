"""the governed claim walks the governed endpoints by bucket

* ``poller_endpoint_health.bucket``: its endpoint's bucket, filled in by a trigger
  whenever a row is made (by 0007's trigger or by hand), and kept by one on an
  update of the endpoint's bucket, which only plain SQL can make;
* ``ix_poller_endpoints_rate_limited`` (bucket, id) and
  ``ix_poller_endpoint_health_not_closed`` (bucket, endpoint_id) replace the two
  indexes of 0023, which had no bucket.

The governed claim walked the governed endpoints in id order: a poller leading
some shards walked past the others' (with every endpoint of 10,000 rate limited,
a shard of 256 found 3 of its 39 a claim, its walk's bound of 1,000 spent on
other shards). It now walks its own buckets' only, as the plain claim does
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

# A health row's bucket is its endpoint's, however the row is made (the trigger of
# 0007, or by hand): filled in before it is written, so an insert that does not
# name it (the trigger of 0007 does not; nor does one that was waiting on this
# migration's lock) still has it.
HEALTH_BUCKET_FUNCTION = """
CREATE FUNCTION poller_endpoint_health_bucket() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.bucket := (SELECT e.bucket FROM poller_endpoints e WHERE e.id = NEW.endpoint_id);
    RETURN NEW;
END
$$
"""
HEALTH_BUCKET_TRIGGER = """
CREATE TRIGGER poller_endpoint_health_bucket BEFORE INSERT ON poller_endpoint_health
FOR EACH ROW EXECUTE FUNCTION poller_endpoint_health_bucket()
"""
# ... and follows it if plain SQL moves the endpoint (the API never does).
ENDPOINT_BUCKET_FUNCTION = """
CREATE FUNCTION poller_endpoints_bucket() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE poller_endpoint_health SET bucket = NEW.bucket WHERE endpoint_id = NEW.id;
    RETURN NEW;
END
$$
"""
ENDPOINT_BUCKET_TRIGGER = """
CREATE TRIGGER poller_endpoints_bucket AFTER UPDATE OF bucket ON poller_endpoints
FOR EACH ROW WHEN (OLD.bucket IS DISTINCT FROM NEW.bucket)
EXECUTE FUNCTION poller_endpoints_bucket()
"""


def upgrade() -> None:
    op.add_column("poller_endpoint_health", sa.Column("bucket", sa.SmallInteger()))
    for statement in (
        HEALTH_BUCKET_FUNCTION,
        HEALTH_BUCKET_TRIGGER,
        ENDPOINT_BUCKET_FUNCTION,
        ENDPOINT_BUCKET_TRIGGER,
    ):
        op.execute(statement)
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
    op.execute("DROP TRIGGER poller_endpoints_bucket ON poller_endpoints")
    op.execute("DROP FUNCTION poller_endpoints_bucket()")
    op.execute("DROP TRIGGER poller_endpoint_health_bucket ON poller_endpoint_health")
    op.execute("DROP FUNCTION poller_endpoint_health_bucket()")
    op.drop_column("poller_endpoint_health", "bucket")
