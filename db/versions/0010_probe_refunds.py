"""probe refunds bounded per message

``poller_outbox.probe_refunds``: attempts handed back after failed probes of an
open circuit. A probe's refund is bounded per message (poller/outcomes.py
``MAX_PROBE_REFUNDS``) like a graceful shutdown's, so that with auto-disable
off a message is not probed for ever. A constant default: adding it rewrites
nothing.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "poller_outbox",
        sa.Column("probe_refunds", sa.Integer(), nullable=False, server_default=sa.text("0")),
    )


def downgrade() -> None:
    op.drop_column("poller_outbox", "probe_refunds")
