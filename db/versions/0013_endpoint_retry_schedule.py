"""an endpoint's own retry schedule (NULL: POLLER_RETRY_SCHEDULE)

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "poller_endpoints",
        sa.Column("retry_schedule", postgresql.ARRAY(sa.Float()), nullable=True),
    )


def downgrade() -> None:
    op.drop_column("poller_endpoints", "retry_schedule")
