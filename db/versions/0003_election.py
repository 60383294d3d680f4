"""election: shard fences, postgres leases, members, cluster facts

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "poller_shard_fences",
        sa.Column("shard", sa.Integer(), nullable=False),
        sa.Column("fence", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("holder", sa.Text(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"),
                  nullable=False),
        sa.PrimaryKeyConstraint("shard", name=op.f("pk_poller_shard_fences")),
    )
    op.create_table(
        "poller_leases",
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("holder", sa.Text(), nullable=False),
        sa.Column("fence", sa.BigInteger(), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_poller_leases")),
    )
    op.create_table(
        "poller_members",
        sa.Column("poller_id", sa.Text(), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("poller_id", name=op.f("pk_poller_members")),
    )
    op.create_table(
        "poller_cluster",
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_poller_cluster")),
    )


def downgrade() -> None:
    op.drop_table("poller_cluster")
    op.drop_table("poller_members")
    op.drop_table("poller_leases")
    op.drop_table("poller_shard_fences")
