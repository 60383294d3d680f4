"""what an API create with an Idempotency-Key made, so the same request again
answers as the first did (poller/web/api/once.py)

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "poller_api_requests",
        sa.Column("caller", sa.Text(), nullable=False),
        sa.Column("idempotency_key", sa.Text(), nullable=False),
        sa.Column("request_sha256", sa.Text(), nullable=False),
        sa.Column("made", sa.Text(), nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.PrimaryKeyConstraint("caller", "idempotency_key", name=op.f("pk_poller_api_requests")),
    )
    op.create_index("ix_poller_api_requests_created_at", "poller_api_requests", ["created_at"])


def downgrade() -> None:
    op.drop_table("poller_api_requests")
