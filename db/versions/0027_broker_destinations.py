"""destinations beyond HTTP: a broker URL's credentials (``user:password``), split off the
URL and sealed like header values (poller/rules/destinations.py)

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("poller_endpoints", sa.Column("url_credentials", sa.Text()))


def downgrade() -> None:
    op.drop_column("poller_endpoints", "url_credentials")
