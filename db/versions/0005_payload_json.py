"""payload as json: the text the application serialized, byte for byte

``jsonb`` re-serializes on the way out (keys reordered, numbers respelled);
``json`` keeps the text it was given, so a receiver gets exactly the bytes the
application produced. Rows stored before keep jsonb's spelling.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30
"""

from __future__ import annotations

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE poller_outbox ALTER COLUMN payload TYPE json USING payload::json")


def downgrade() -> None:
    op.execute("ALTER TABLE poller_outbox ALTER COLUMN payload TYPE jsonb USING payload::jsonb")
