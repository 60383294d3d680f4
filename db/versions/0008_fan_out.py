"""fan-out: published events, endpoint subscriptions, tenants and payload filters

* ``poller_events``: each published event once (type, payload, idempotency key,
  tenant, ordering key, time, how many endpoints it reached); its key is unique
  within its tenant;
* ``poller_endpoints``: ``event_types`` (the names and ``prefix*`` patterns it is
  subscribed to; empty for existing endpoints, which keep working with
  ``enqueue`` and receive no published event until subscribed), ``tenant``
  (indexed) and ``payload_filter`` (a JSON object the payload must contain);
* ``poller_outbox``: ``event_id`` (indexed), and ``payload`` may be NULL on a
  published event's rows — the payload is the event's, stored once.

Downgrade copies each event's payload into its rows before dropping the events,
so nothing queued is lost.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "poller_events",
        sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("event_type", sa.Text(), nullable=False),
        sa.Column("payload", postgresql.JSON(), nullable=False),
        sa.Column("idempotency_key", sa.Text(), nullable=False),
        sa.Column("tenant", sa.Text()),
        sa.Column("ordering_key", sa.Text()),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(),
                  nullable=False),
        sa.Column("fanned_out", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_poller_events")),
    )
    op.create_index("uq_poller_events_tenant_key", "poller_events",
                    [sa.text("coalesce(tenant, '')"), "idempotency_key"], unique=True)
    op.create_index("ix_poller_events_created_at", "poller_events", ["created_at", "id"])
    op.add_column("poller_endpoints", sa.Column("event_types", postgresql.ARRAY(sa.Text()),
                                                server_default=sa.text("'{}'"), nullable=False))
    op.add_column("poller_endpoints", sa.Column("tenant", sa.Text()))
    op.add_column("poller_endpoints", sa.Column("payload_filter", postgresql.JSONB()))
    op.create_check_constraint(op.f("ck_poller_endpoints_payload_filter_object"),
                               "poller_endpoints",
                               "payload_filter IS NULL OR jsonb_typeof(payload_filter) = 'object'")
    op.create_index("ix_poller_endpoints_tenant", "poller_endpoints",
                    [sa.text("coalesce(tenant, '')")])
    op.create_index("ix_poller_endpoints_event_types", "poller_endpoints", ["event_types"],
                    postgresql_using="gin", postgresql_with={"fastupdate": "off"})
    op.add_column("poller_outbox", sa.Column("event_id", sa.BigInteger()))
    op.create_foreign_key(op.f("fk_poller_outbox_event_id_poller_events"), "poller_outbox",
                          "poller_events", ["event_id"], ["id"], ondelete="RESTRICT")
    op.create_index("ix_poller_outbox_event", "poller_outbox", ["event_id"],
                    postgresql_where=sa.text("event_id IS NOT NULL"))
    op.alter_column("poller_outbox", "payload", nullable=True)
    op.create_check_constraint(op.f("ck_poller_outbox_payload_or_event"), "poller_outbox",
                               "payload IS NOT NULL OR event_id IS NOT NULL")


def downgrade() -> None:
    op.execute(
        "UPDATE poller_outbox o SET payload = ev.payload FROM poller_events ev "
        "WHERE o.event_id = ev.id AND o.payload IS NULL"
    )
    op.drop_constraint(op.f("ck_poller_outbox_payload_or_event"), "poller_outbox", type_="check")
    op.alter_column("poller_outbox", "payload", nullable=False)
    op.drop_index("ix_poller_outbox_event", table_name="poller_outbox")
    op.drop_constraint(op.f("fk_poller_outbox_event_id_poller_events"), "poller_outbox",
                       type_="foreignkey")
    op.drop_column("poller_outbox", "event_id")
    op.drop_index("ix_poller_endpoints_event_types", table_name="poller_endpoints")
    op.drop_index("ix_poller_endpoints_tenant", table_name="poller_endpoints")
    op.drop_constraint(op.f("ck_poller_endpoints_payload_filter_object"), "poller_endpoints",
                       type_="check")
    for column in ("payload_filter", "tenant", "event_types"):
        op.drop_column("poller_endpoints", column)
    op.drop_index("ix_poller_events_created_at", table_name="poller_events")
    op.drop_index("uq_poller_events_tenant_key", table_name="poller_events")
    op.drop_table("poller_events")
