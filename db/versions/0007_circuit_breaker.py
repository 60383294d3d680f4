"""circuit breaker: per-endpoint health shared by every poller

``poller_endpoint_health``: one row per endpoint (made for existing ones here,
and with each new endpoint), holding the breaker's state, consecutive failed
sends, the cool-down in force, and the last success and failure.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

# Every endpoint has its health row, however it was made (the API or plain SQL).
HEALTH_FUNCTION = """
CREATE FUNCTION poller_endpoints_health() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO poller_endpoint_health (endpoint_id) VALUES (NEW.id) ON CONFLICT DO NOTHING;
    RETURN NEW;
END
$$
"""
HEALTH_TRIGGER = """
CREATE TRIGGER poller_endpoints_health AFTER INSERT ON poller_endpoints
FOR EACH ROW EXECUTE FUNCTION poller_endpoints_health()
"""


def upgrade() -> None:
    op.create_table(
        "poller_endpoint_health",
        sa.Column("endpoint_id", sa.BigInteger(), nullable=False),
        sa.Column("state", sa.Text(), server_default=sa.text("'closed'"), nullable=False),
        sa.Column("consecutive_failures", sa.Integer(), server_default=sa.text("0"),
                  nullable=False),
        sa.Column("cooldown", sa.Float()),
        sa.Column("opened_at", sa.DateTime(timezone=True)),
        sa.Column("open_until", sa.DateTime(timezone=True)),
        sa.Column("probe_at", sa.DateTime(timezone=True)),
        sa.Column("opens", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("probes", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("last_success_at", sa.DateTime(timezone=True)),
        sa.Column("last_failure_at", sa.DateTime(timezone=True)),
        sa.CheckConstraint("state IN ('closed', 'open', 'half_open')",
                           name=op.f("ck_poller_endpoint_health_state_valid")),
        sa.ForeignKeyConstraint(["endpoint_id"], ["poller_endpoints.id"], ondelete="CASCADE",
                                name=op.f("fk_poller_endpoint_health_endpoint_id_poller_endpoints")),
        sa.PrimaryKeyConstraint("endpoint_id", name=op.f("pk_poller_endpoint_health")),
    )
    op.execute("INSERT INTO poller_endpoint_health (endpoint_id) SELECT id FROM poller_endpoints")
    op.execute(HEALTH_FUNCTION)
    op.execute(HEALTH_TRIGGER)


def downgrade() -> None:
    op.execute("DROP TRIGGER poller_endpoints_health ON poller_endpoints")
    op.execute("DROP FUNCTION poller_endpoints_health()")
    op.drop_table("poller_endpoint_health")
