"""an endpoint's TLS: a client certificate and key (mutual TLS), a private CA bundle

``client_cert`` and ``ca_bundle`` are PEM text (public); ``client_key`` is the
client certificate's private key, sealed like signing secrets (poller/rules/keyring.py).

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("poller_endpoints", sa.Column("client_cert", sa.Text()))
    op.add_column("poller_endpoints", sa.Column("client_key", sa.Text()))
    op.add_column("poller_endpoints", sa.Column("ca_bundle", sa.Text()))
    op.create_check_constraint(
        op.f("ck_poller_endpoints_client_cert_with_key"),
        "poller_endpoints",
        "(client_cert IS NULL) = (client_key IS NULL)",
    )


def downgrade() -> None:
    op.drop_constraint(
        op.f("ck_poller_endpoints_client_cert_with_key"), "poller_endpoints", type_="check"
    )
    op.drop_column("poller_endpoints", "ca_bundle")
    op.drop_column("poller_endpoints", "client_key")
    op.drop_column("poller_endpoints", "client_cert")
