"""trace context through the outbox: an application's W3C traceparent and tracestate,
stored with the message (or the event, for fan-out) by the insert that enqueues it; and
an endpoint's choice to receive it (poller/rules/tracing.py)

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    for table in ("poller_outbox", "poller_events"):
        op.add_column(table, sa.Column("traceparent", sa.Text()))
        op.add_column(table, sa.Column("tracestate", sa.Text()))
    op.add_column(
        "poller_endpoints",
        sa.Column("trace_context", sa.Boolean(), nullable=False, server_default=sa.text("true")),
    )


def downgrade() -> None:
    op.drop_column("poller_endpoints", "trace_context")
    for table in ("poller_outbox", "poller_events"):
        op.drop_column(table, "tracestate")
        op.drop_column(table, "traceparent")
