"""every failed request counted: probe refunds bounded, a health backlog, a running count

* ``poller_outbox.probe_refunds``: attempts handed back after failed probes of
  an open circuit, bounded per message (poller/rules/outcomes.py
  ``MAX_PROBE_REFUNDS``) like a graceful shutdown's, so that with auto-disable
  off a message is not probed for ever. A constant default: no rewrite.
* ``poller_health_backlog``: what a completion told an endpoint's health while
  the endpoint's rows were locked by someone else; the next completion (or the
  maintenance sweep) that can lock them folds it in (JUDGE_HEALTH). So a
  completion never waits on an operator, and no failed request is lost.
* ``poller_endpoint_health.failed_requests``: every failed request counted,
  never reset.

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
    op.add_column(
        "poller_endpoint_health",
        sa.Column("failed_requests", sa.BigInteger(), nullable=False, server_default=sa.text("0")),
    )
    op.create_table(
        "poller_health_backlog",
        sa.Column("id", sa.BigInteger(), sa.Identity(), primary_key=True),
        sa.Column("endpoint_id", sa.BigInteger(), nullable=False),
        sa.Column("ok", sa.Integer(), nullable=False),
        sa.Column("bad", sa.Integer(), nullable=False),
        sa.Column("pause", sa.Float()),
        sa.Column("gone", sa.Text()),
        sa.Column("error", sa.Text()),
    )
    op.create_index(
        "ix_poller_health_backlog_endpoint", "poller_health_backlog", ["endpoint_id"]
    )


def downgrade() -> None:
    op.drop_table("poller_health_backlog")
    op.drop_column("poller_endpoint_health", "failed_requests")
    op.drop_column("poller_outbox", "probe_refunds")
