"""an endpoint's age limit (NULL: none), and attempts of kind 'expiry'

A message older than its endpoint's ``max_age`` ends ``failed`` with outcome
``expired`` at its next claim, recorded as an attempt of kind ``expiry`` (nothing
was sent: it counts against the message, never against the endpoint's health).

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

KIND_VALID = "ck_poller_delivery_attempts_kind_valid"


def upgrade() -> None:
    op.add_column("poller_endpoints", sa.Column("max_age", sa.Float(), nullable=True))
    op.create_check_constraint(
        op.f("ck_poller_endpoints_max_age_positive"),
        "poller_endpoints",
        "max_age IS NULL OR max_age > 0",
    )
    op.drop_constraint(op.f(KIND_VALID), "poller_delivery_attempts", type_="check")
    op.create_check_constraint(
        op.f(KIND_VALID),
        "poller_delivery_attempts",
        "kind IN ('send', 'lookup', 'manual', 'expiry')",
    )


def downgrade() -> None:
    op.execute("DELETE FROM poller_delivery_attempts WHERE kind = 'expiry'")
    op.drop_constraint(op.f(KIND_VALID), "poller_delivery_attempts", type_="check")
    op.create_check_constraint(
        op.f(KIND_VALID), "poller_delivery_attempts", "kind IN ('send', 'lookup', 'manual')"
    )
    op.drop_constraint(
        op.f("ck_poller_endpoints_max_age_positive"), "poller_endpoints", type_="check"
    )
    op.drop_column("poller_endpoints", "max_age")
