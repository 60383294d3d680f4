"""cancelled messages (a terminal state only an operator enters) and paused endpoints

``poller admin cancel`` ends pending and waiting messages ``cancelled`` (at
``cancelled_at``); ``poller endpoints pause`` holds an endpoint's messages until
``held_until`` (NULL: until resumed) while ``held_by`` names who paused it.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

STATUS_VALID = "ck_poller_outbox_status_valid"


def upgrade() -> None:
    op.add_column("poller_outbox", sa.Column("cancelled_at", sa.DateTime(timezone=True)))
    op.drop_constraint(op.f(STATUS_VALID), "poller_outbox", type_="check")
    op.create_check_constraint(
        op.f(STATUS_VALID),
        "poller_outbox",
        "status IN ('waiting', 'pending', 'in_flight', 'delivered', 'failed', 'cancelled')",
    )
    op.create_index(
        "ix_poller_outbox_cancelled",
        "poller_outbox",
        ["cancelled_at"],
        postgresql_where=sa.text("status = 'cancelled'"),
    )
    op.add_column("poller_endpoints", sa.Column("held_until", sa.DateTime(timezone=True)))
    op.add_column("poller_endpoints", sa.Column("held_by", sa.Text()))


def downgrade() -> None:
    op.drop_column("poller_endpoints", "held_by")
    op.drop_column("poller_endpoints", "held_until")
    op.drop_index("ix_poller_outbox_cancelled", table_name="poller_outbox")
    op.execute(
        "UPDATE poller_outbox SET status = 'failed', failed_at = cancelled_at "
        "WHERE status = 'cancelled'"
    )
    op.drop_constraint(op.f(STATUS_VALID), "poller_outbox", type_="check")
    op.create_check_constraint(
        op.f(STATUS_VALID),
        "poller_outbox",
        "status IN ('waiting', 'pending', 'in_flight', 'delivered', 'failed')",
    )
    op.drop_column("poller_outbox", "cancelled_at")
