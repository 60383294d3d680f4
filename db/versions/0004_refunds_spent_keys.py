"""refunds and spent keys: bounded graceful refunds; keys outlive their purged rows

* ``poller_outbox.refunds`` counts the attempts graceful shutdowns handed back,
  so they can be bounded.
* ``poller_spent_keys`` keeps the (endpoint, idempotency key) of purged rows for
  ``POLLER_RETENTION_KEYS``, so re-enqueueing a delivered-then-purged key is
  refused instead of delivered twice.

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


def downgrade() -> None:
    op.drop_index("ix_poller_spent_keys_purged_at", table_name="poller_spent_keys")
    op.drop_table("poller_spent_keys")
    op.drop_column("poller_outbox", "refunds")
