"""the SQL doors: poller_enqueue, poller_publish and their batch forms in the database

Any application that writes to PostgreSQL — any driver, any language, an ORM's raw SQL,
a trigger — enqueues and publishes inside its own transaction through these functions
(db/sql/0026_doors.sql), and so do the Python doors: one definition of a write.

* ``poller_events.payload_checked``: false when the event was published through a door
  that could not check its payload against its type's JSON Schema in the catalog (the
  SQL functions cannot): the poller checks it before it is sent.
* attempts of kind ``refusal``: the poller found such a payload breaking its schema and
  failed the message unsent (no request was made, nothing of the endpoint's health).

Nothing else changes: a poller of the version before goes on as it did.

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-06
"""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from alembic import op

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None

FUNCTIONS = (Path(__file__).resolve().parent.parent / "sql" / "0026_doors.sql").read_text()
DROPPED = (
    "poller_publish(text, text, text, text, text, timestamptz, interval, text, text)",
    "poller_publish(text, json, text, text, text, timestamptz, interval, text, text)",
    "poller_publish(text, jsonb, text, text, text, timestamptz, interval, text, text)",
    "poller_publish_many(text[], text[], text[], text[], text[], timestamptz[], interval[], "
    "text, text, boolean, integer, integer, boolean)",
    "poller_unpublish(bigint)",
    "poller_try_publish(text, text, text, text, timestamptz, interval, text, text, boolean, "
    "integer, integer, boolean)",
    "poller_enqueue_many(text[], text[], text[], text[], text[], timestamptz[], interval[], "
    "integer[], text, text, integer, integer, boolean)",
    "poller_enqueue(text, text, text, text, text, timestamptz, interval, integer, text, text)",
    "poller_enqueue(text, text, json, text, text, timestamptz, interval, integer, text, text)",
    "poller_enqueue(text, text, jsonb, text, text, timestamptz, interval, integer, text, text)",
    "poller_try_enqueue(text, text, text, text, text, timestamptz, interval, integer, text, "
    "text, integer, integer, boolean)",
    "poller_endpoints_for(text[])",
    "poller_insert_rows(bigint[], text[], json[], text[], integer[], timestamptz[], "
    "double precision[], text[], bigint[], text, text, boolean)",
    "poller_raise(text[])",
    "poller_tenant_refusal(text)",
    "poller_refusal(text, text, text, text, timestamptz, interval, integer, integer)",
    "poller_setting(text, text)",
)


KIND_VALID = "ck_poller_delivery_attempts_kind_valid"
KINDS = "'send', 'lookup', 'manual', 'expiry'"


def upgrade() -> None:
    op.drop_constraint(op.f(KIND_VALID), "poller_delivery_attempts", type_="check")
    op.create_check_constraint(
        op.f(KIND_VALID), "poller_delivery_attempts", f"kind IN ({KINDS}, 'refusal')"
    )
    op.add_column(
        "poller_events",
        sa.Column("payload_checked", sa.Boolean(), nullable=False, server_default=sa.true()),
    )
    op.execute(FUNCTIONS)


def downgrade() -> None:
    for function in DROPPED:
        op.execute(f"DROP FUNCTION {function}")
    op.drop_column("poller_events", "payload_checked")
    op.execute("DELETE FROM poller_delivery_attempts WHERE kind = 'refusal'")
    op.drop_constraint(op.f(KIND_VALID), "poller_delivery_attempts", type_="check")
    op.create_check_constraint(op.f(KIND_VALID), "poller_delivery_attempts", f"kind IN ({KINDS})")
