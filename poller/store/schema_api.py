"""The management API's tables: its tokens, the event-type catalog, and what an
idempotent request made. On poller/store/schema.py's one metadata (Alembic migrates both:
db/env.py imports this module too), apart from the delivery tables they have nothing
to do with.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Identity,
    Index,
    Table,
    Text,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB

from poller.store.schema import metadata

# API tokens: a name, a scope (``admin`` or ``tenant:NAME``), and the SHA-256 of the
# token, never the token. Revoked tokens stay, so ``tokens list`` can say who had one.
api_tokens = Table(
    "poller_api_tokens",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("name", Text, nullable=False, unique=True),
    Column("scope", Text, nullable=False),
    Column("read_only", Boolean, nullable=False, server_default=text("false")),
    Column("token_sha256", Text, nullable=False, unique=True),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("created_by", Text),
    Column("expires_at", DateTime(timezone=True)),
    Column("revoked_at", DateTime(timezone=True)),
    Column("last_used_at", DateTime(timezone=True)),
    CheckConstraint("scope = 'admin' OR scope LIKE 'tenant:_%'", name="scope"),
)

# The event-type catalog (poller/outbox/catalog.py): what each published event type is, and
# the JSON Schema its payloads must match (publish refuses one that does not).
event_types = Table(
    "poller_event_types",
    metadata,
    Column("name", Text, primary_key=True),
    Column("description", Text, nullable=False, server_default=text("''")),
    Column("schema", JSONB),
    Column("example", JSONB),
    Column("deprecated", Boolean, nullable=False, server_default=text("false")),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)

# What an API create with an ``Idempotency-Key`` made (poller/web/api/once.py), so the same
# request again answers as the first did; kept a day.
api_requests = Table(
    "poller_api_requests",
    metadata,
    Column("caller", Text, primary_key=True),
    Column("idempotency_key", Text, primary_key=True),
    Column("request_sha256", Text, nullable=False),
    Column("made", Text, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Index("ix_poller_api_requests_created_at", "created_at"),
)

# Portal links already opened (poller/access/portal.py): a link opens the portal once. A row
# outlives its link's expiry by portal.USED_KEPT, then goes.
portal_links_used = Table(
    "poller_portal_links_used",
    metadata,
    Column("nonce", Text, primary_key=True),
    Column("expires_at", DateTime(timezone=True), nullable=False),
    Index("ix_poller_portal_links_used_expires_at", "expires_at"),
)
