"""claim per endpoint: index (endpoint_id, next_attempt_at, id) of pending rows replaces the global one

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_index(
        "ix_poller_outbox_claim",
        table_name="poller_outbox",
        postgresql_where=sa.text("status = 'pending'"),
    )
    op.create_index(
        "ix_poller_outbox_endpoint_due",
        "poller_outbox",
        ["endpoint_id", "next_attempt_at", "id"],
        unique=False,
        postgresql_where=sa.text("status = 'pending'"),
    )


def downgrade() -> None:
    op.drop_index(
        "ix_poller_outbox_endpoint_due",
        table_name="poller_outbox",
        postgresql_where=sa.text("status = 'pending'"),
    )
    op.create_index(
        "ix_poller_outbox_claim",
        "poller_outbox",
        ["next_attempt_at", "id"],
        unique=False,
        postgresql_where=sa.text("status = 'pending'"),
    )
