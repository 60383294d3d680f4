"""headers an endpoint sends with each delivery and lookup (sealed like its secrets)

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("poller_endpoints", sa.Column("headers", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("poller_endpoints", "headers")
