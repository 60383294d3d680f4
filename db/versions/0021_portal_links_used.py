"""portal links opened, so each opens the portal once (poller/access/portal.py)

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "poller_portal_links_used",
        sa.Column("nonce", sa.Text(), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("nonce", name=op.f("pk_poller_portal_links_used")),
    )
    op.create_index(
        "ix_poller_portal_links_used_expires_at", "poller_portal_links_used", ["expires_at"]
    )


def downgrade() -> None:
    op.drop_table("poller_portal_links_used")
