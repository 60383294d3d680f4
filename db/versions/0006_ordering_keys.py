"""ordering keys: per-key FIFO delivery (``waiting`` messages behind their key's head)

* ``poller_outbox.ordering_key`` and the ``waiting`` status; waiting rows have
  their own partial index, so the claim path never reads them;
* ``poller_ordering_keys``: per live (endpoint, key), the lock and the head;
* ``poller_endpoints.on_failed_head``: ``block`` (default) or ``skip``.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("poller_outbox", sa.Column("ordering_key", sa.Text()))
    op.drop_constraint(op.f("ck_poller_outbox_status_valid"), "poller_outbox", type_="check")
    op.create_check_constraint(
        op.f("ck_poller_outbox_status_valid"),
        "poller_outbox",
        "status IN ('waiting', 'pending', 'in_flight', 'delivered', 'failed')",
    )
    op.create_check_constraint(
        op.f("ck_poller_outbox_waiting_is_ordered"),
        "poller_outbox",
        "status <> 'waiting' OR ordering_key IS NOT NULL",
    )
    op.create_index(
        "ix_poller_outbox_waiting",
        "poller_outbox",
        ["endpoint_id", "ordering_key", "id"],
        postgresql_where=sa.text("status = 'waiting'"),
    )
    op.add_column(
        "poller_endpoints",
        sa.Column("on_failed_head", sa.Text(), server_default=sa.text("'block'"), nullable=False),
    )
    op.create_check_constraint(
        op.f("ck_poller_endpoints_on_failed_head_valid"),
        "poller_endpoints",
        "on_failed_head IN ('block', 'skip')",
    )
    op.create_table(
        "poller_ordering_keys",
        sa.Column("endpoint_id", sa.BigInteger(), nullable=False),
        sa.Column("ordering_key", sa.Text(), nullable=False),
        sa.Column("head_id", sa.BigInteger()),
        sa.Column("blocked_since", sa.DateTime(timezone=True)),
        sa.ForeignKeyConstraint(["endpoint_id"], ["poller_endpoints.id"], ondelete="CASCADE",
                                name=op.f("fk_poller_ordering_keys_endpoint_id_poller_endpoints")),
        sa.PrimaryKeyConstraint("endpoint_id", "ordering_key",
                                name=op.f("pk_poller_ordering_keys")),
    )
    op.create_index("ix_poller_ordering_keys_blocked", "poller_ordering_keys", ["blocked_since"],
                    postgresql_where=sa.text("blocked_since IS NOT NULL"))


def downgrade() -> None:
    # Unordered from here on: waiting messages become pending, nothing is lost.
    op.execute("UPDATE poller_outbox SET status = 'pending' WHERE status = 'waiting'")
    op.drop_table("poller_ordering_keys")
    op.drop_constraint(op.f("ck_poller_endpoints_on_failed_head_valid"), "poller_endpoints",
                       type_="check")
    op.drop_column("poller_endpoints", "on_failed_head")
    op.drop_index("ix_poller_outbox_waiting", table_name="poller_outbox")
    op.drop_constraint(op.f("ck_poller_outbox_waiting_is_ordered"), "poller_outbox",
                       type_="check")
    op.drop_constraint(op.f("ck_poller_outbox_status_valid"), "poller_outbox", type_="check")
    op.create_check_constraint(
        op.f("ck_poller_outbox_status_valid"), "poller_outbox",
        "status IN ('pending', 'in_flight', 'delivered', 'failed')",
    )
    op.drop_column("poller_outbox", "ordering_key")
