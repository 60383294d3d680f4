"""refunds and spent keys: bounded graceful refunds; keys outlive their purged rows

* ``poller_outbox.refunds`` counts the attempts graceful shutdowns handed back,
  so they can be bounded.
* ``poller_spent_keys`` keeps the (endpoint, idempotency key) of purged rows for
  ``POLLER_RETENTION_KEYS``, so re-enqueueing a delivered-then-purged key is
  refused instead of delivered twice.
* a trigger keeps ``poller_endpoints.updated_at`` current on every change, even
  one made by hand in SQL: pollers reload an endpoint when it moves.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

# clock_timestamp(), not now(): two changes in one transaction must differ too, and
# it never goes back (a poller compares it with the version it holds).
TOUCH_FUNCTION = """
CREATE FUNCTION poller_endpoints_touch() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.updated_at := greatest(clock_timestamp(), OLD.updated_at + interval '1 microsecond');
    RETURN NEW;
END
$$
"""
TOUCH_TRIGGER = """
CREATE TRIGGER poller_endpoints_touch BEFORE UPDATE ON poller_endpoints
FOR EACH ROW WHEN (OLD IS DISTINCT FROM NEW) EXECUTE FUNCTION poller_endpoints_touch()
"""


def upgrade() -> None:
    op.add_column(
        "poller_outbox",
        sa.Column("refunds", sa.Integer(), server_default=sa.text("0"), nullable=False),
    )
    op.create_table(
        "poller_spent_keys",
        sa.Column("endpoint_id", sa.BigInteger(), nullable=False),
        sa.Column("idempotency_key", sa.Text(), nullable=False),
        sa.Column("purged_at", sa.DateTime(timezone=True), server_default=sa.text("now()"),
                  nullable=False),
        sa.ForeignKeyConstraint(["endpoint_id"], ["poller_endpoints.id"], ondelete="CASCADE",
                                name=op.f("fk_poller_spent_keys_endpoint_id_poller_endpoints")),
        sa.PrimaryKeyConstraint("endpoint_id", "idempotency_key", name=op.f("pk_poller_spent_keys")),
    )
    op.create_index("ix_poller_spent_keys_purged_at", "poller_spent_keys", ["purged_at"])
    op.execute(TOUCH_FUNCTION)
    op.execute(TOUCH_TRIGGER)


def downgrade() -> None:
    op.execute("DROP TRIGGER poller_endpoints_touch ON poller_endpoints")
    op.execute("DROP FUNCTION poller_endpoints_touch()")
    op.drop_index("ix_poller_spent_keys_purged_at", table_name="poller_spent_keys")
    op.drop_table("poller_spent_keys")
    op.drop_column("poller_outbox", "refunds")
