"""the management API's tokens: a name, a scope (admin or tenant:NAME), read-only or
not, an expiry, and the SHA-256 of the token, never the token (poller/access/tokens.py)

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "poller_api_tokens",
        sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("scope", sa.Text(), nullable=False),
        sa.Column("read_only", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column("token_sha256", sa.Text(), nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column("created_by", sa.Text()),
        sa.Column("expires_at", sa.DateTime(timezone=True)),
        sa.Column("revoked_at", sa.DateTime(timezone=True)),
        sa.Column("last_used_at", sa.DateTime(timezone=True)),
        sa.CheckConstraint(
            "scope = 'admin' OR scope LIKE 'tenant:_%'", name=op.f("ck_poller_api_tokens_scope")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_poller_api_tokens")),
        sa.UniqueConstraint("name", name=op.f("uq_poller_api_tokens_name")),
        sa.UniqueConstraint("token_sha256", name=op.f("uq_poller_api_tokens_token_sha256")),
    )


def downgrade() -> None:
    op.drop_table("poller_api_tokens")
