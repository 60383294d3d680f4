"""dashboard: an endpoint's failures from an index, attempts that name their endpoint

* ``ix_poller_outbox_failed_endpoint`` (endpoint_id, failed_at, id) of failed
  rows: the dashboard's failed list filtered by endpoint reads one page from it
  instead of walking every failure newer than the page;
* ``poller_delivery_attempts.endpoint_id``: the message's endpoint, so success
  ratios per endpoint (``endpoints health``, the dashboard) are one pass over
  the day's attempts, not a join with the outbox. Nullable, no default: adding it
  rewrites nothing. The last day's attempts are filled in (the ratios look back
  a day); older ones keep NULL, which nothing reads.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        "ix_poller_outbox_failed_endpoint",
        "poller_outbox",
        ["endpoint_id", "failed_at", "id"],
        unique=False,
        postgresql_where=sa.text("status = 'failed'"),
    )
    op.add_column("poller_delivery_attempts", sa.Column("endpoint_id", sa.BigInteger()))
    op.execute(
        """
        UPDATE poller_delivery_attempts a SET endpoint_id = o.endpoint_id
        FROM poller_outbox o
        WHERE o.id = a.message_id AND a.finished_at > now() - interval '25 hours'
        """
    )


def downgrade() -> None:
    op.drop_column("poller_delivery_attempts", "endpoint_id")
    op.drop_index(
        "ix_poller_outbox_failed_endpoint",
        table_name="poller_outbox",
        postgresql_where=sa.text("status = 'failed'"),
    )
