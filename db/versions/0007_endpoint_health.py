"""endpoint health: circuit breaker, rate limits, pauses, auto-disable

* ``poller_endpoint_health``: one row per endpoint (made for existing ones here,
  and by a trigger with each new one) holding the breaker's state, consecutive
  failed sends, the cool-down in force, the rate limit's token bucket, and the
  last success and failure;
* ``poller_endpoints``: per-endpoint ``rate_limit``/``rate_burst`` and breaker
  overrides (``circuit_failures``, ``circuit_cooldown``), and ``paused_until``
  — set while the circuit is open (``infinity``) or after a ``429`` with
  ``Retry-After`` — which the claim statement reads to skip the endpoint;
* a BRIN index on ``poller_delivery_attempts.finished_at`` for the success
  ratios of ``poller endpoints health`` (nearly free to maintain: rows arrive in
  time order).

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

ENDPOINT_CHECKS = {
    "rate_limit_positive": "rate_limit IS NULL OR (rate_limit > 0 AND rate_limit <= 1000000)",
    "rate_burst_positive": "rate_burst IS NULL OR rate_burst >= 1",
    "circuit_failures_not_negative": "circuit_failures IS NULL OR circuit_failures >= 0",
    "circuit_cooldown_positive": (
        "circuit_cooldown IS NULL OR (circuit_cooldown > 0 AND circuit_cooldown <= 86400)"
    ),
}


def upgrade() -> None:
    for column in (
        sa.Column("rate_limit", sa.Float()),
        sa.Column("rate_burst", sa.Integer()),
        sa.Column("circuit_failures", sa.Integer()),
        sa.Column("circuit_cooldown", sa.Float()),
        sa.Column("paused_until", sa.DateTime(timezone=True)),
    ):
        op.add_column("poller_endpoints", column)
    for name, condition in ENDPOINT_CHECKS.items():
        op.create_check_constraint(op.f(f"ck_poller_endpoints_{name}"), "poller_endpoints",
                                   condition)
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
        sa.Column("failing_since", sa.DateTime(timezone=True)),
        sa.Column("last_error", sa.Text()),
        sa.Column("tokens", sa.Float(), server_default=sa.text("0"), nullable=False),
        sa.Column("tokens_at", sa.DateTime(timezone=True), server_default=sa.func.now(),
                  nullable=False),
        sa.CheckConstraint("state IN ('closed', 'open', 'half_open')",
                           name=op.f("ck_poller_endpoint_health_state_valid")),
        sa.ForeignKeyConstraint(["endpoint_id"], ["poller_endpoints.id"], ondelete="CASCADE",
                                name=op.f("fk_poller_endpoint_health_endpoint_id_poller_endpoints")),
        sa.PrimaryKeyConstraint("endpoint_id", name=op.f("pk_poller_endpoint_health")),
    )
    op.execute("INSERT INTO poller_endpoint_health (endpoint_id) SELECT id FROM poller_endpoints")
    op.execute(HEALTH_FUNCTION)
    op.execute(HEALTH_TRIGGER)
    op.create_index("ix_poller_delivery_attempts_finished_at", "poller_delivery_attempts",
                    ["finished_at"], postgresql_using="brin")


def downgrade() -> None:
    op.drop_index("ix_poller_delivery_attempts_finished_at",
                  table_name="poller_delivery_attempts")
    op.execute("DROP TRIGGER poller_endpoints_health ON poller_endpoints")
    op.execute("DROP FUNCTION poller_endpoints_health()")
    op.drop_table("poller_endpoint_health")
    for name in ENDPOINT_CHECKS:
        op.drop_constraint(op.f(f"ck_poller_endpoints_{name}"), "poller_endpoints",
                           type_="check")
    for column in ("paused_until", "circuit_cooldown", "circuit_failures", "rate_burst",
                   "rate_limit"):
        op.drop_column("poller_endpoints", column)
