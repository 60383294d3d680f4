"""an endpoint's rate_limit is at least 0.00001 a second (poller/rules/health.py)

Below it, the token bucket's arithmetic in PostgreSQL underflowed and every claim of
rate-limited endpoints failed. A stored rate below the floor is raised to it.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-03
"""

from __future__ import annotations

from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None

CONSTRAINT = "ck_poller_endpoints_rate_limit_positive"


def upgrade() -> None:
    op.execute("UPDATE poller_endpoints SET rate_limit = 0.00001 WHERE rate_limit < 0.00001")
    op.drop_constraint(op.f(CONSTRAINT), "poller_endpoints", type_="check")
    op.create_check_constraint(
        op.f(CONSTRAINT),
        "poller_endpoints",
        "rate_limit IS NULL OR (rate_limit >= 0.00001 AND rate_limit <= 1000000)",
    )


def downgrade() -> None:
    op.drop_constraint(op.f(CONSTRAINT), "poller_endpoints", type_="check")
    op.create_check_constraint(
        op.f(CONSTRAINT),
        "poller_endpoints",
        "rate_limit IS NULL OR (rate_limit > 0 AND rate_limit <= 1000000)",
    )
