"""the governed claim finds its endpoints by two small indexes

* ``ix_poller_endpoints_rate_limited`` (id) of the endpoints with a rate limit;
* ``ix_poller_endpoint_health_not_closed`` (endpoint_id) of the circuits not closed.

The governed claim (rate limits, circuits' probes) runs ten times a second while
any endpoint is rate limited or failing; it walked every endpoint with pending
messages to find the governed ones among them: 47 ms over 10,000 endpoints with
messages. From these indexes it visits only the governed endpoints. Both tables
are small (a row per endpoint): the indexes build in moments.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        "ix_poller_endpoints_rate_limited",
        "poller_endpoints",
        ["id"],
        unique=False,
        postgresql_where=sa.text("rate_limit IS NOT NULL"),
    )
    op.create_index(
        "ix_poller_endpoint_health_not_closed",
        "poller_endpoint_health",
        ["endpoint_id"],
        unique=False,
        postgresql_where=sa.text("state <> 'closed'"),
    )


def downgrade() -> None:
    op.drop_index("ix_poller_endpoint_health_not_closed", table_name="poller_endpoint_health")
    op.drop_index("ix_poller_endpoints_rate_limited", table_name="poller_endpoints")
