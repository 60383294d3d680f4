"""SQLAlchemy table definitions: the schema Alembic migrates to. No logic here.

Tables carry a ``poller_`` prefix so they can live in the application's own
database beside tables called ``outbox`` or ``endpoints``; the Alembic version
table is ``poller_alembic_version`` for the same reason. The election's tables are
in poller/store/schema_election.py, the management API's in poller/store/schema_api.py, on the
same metadata.

Row state machine of ``poller_outbox.status`` (every write after a claim is
fenced by ``claim_token``, see poller/rows/claims.py)::

    waiting ──its key's head ended (delivered, or failed and skipped)──▶ pending
    pending ──claim──▶ in_flight ──2xx──────────────────────▶ delivered
       ▲                   │ retryable, attempts < max ─────▶ pending, due after backoff
       │                   │ outcome unknown ───────────────▶ pending + needs_lookup
       │                   │ retryable and attempts = max ──▶ failed
       │                   │ 410 Gone ──────────────────────▶ failed (endpoint disabled)
       │                   │ the delivery raised ───────────▶ as a retryable failure (counted)
       │                   │ graceful shutdown ─────────────▶ pending, attempt not counted
       │                   │                                  (at most MAX_REFUNDS times)
       │                   └ claim lease expired ───────────▶ pending + needs_lookup, or failed
       └──── admin retry ◀── failed, cancelled
    waiting, pending ──admin cancel──▶ cancelled (only an operator cancels; in_flight never)

A message with an ``ordering_key`` is ``waiting`` while an earlier message of
its (endpoint, key) has not ended; only the key's head is ever ``pending``
(poller/rows/ordering.py).
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Identity,
    Index,
    Integer,
    MetaData,
    Sequence,
    SmallInteger,
    Table,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSON, JSONB

from poller.rules.parse import ROW_ID_MAX as ROW_ID_MAX  # ids are bigints

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = MetaData(naming_convention=NAMING_CONVENTION)

STATUSES = ("waiting", "pending", "in_flight", "delivered", "failed", "cancelled")
ENDED = ("delivered", "failed", "cancelled")  # terminal; only an operator cancels
ON_FAILED_HEAD = ("block", "skip")
ATTEMPT_KINDS = ("send", "lookup", "manual", "expiry", "refusal")
BUCKETS = 256
NOTIFY_CHANNEL = "poller_outbox"

# One value per claim batch; strictly increasing, so a later claim always has a
# larger token than any earlier one (useful when reading attempt history).
claim_token_seq = Sequence("poller_claim_token_seq", metadata=metadata, start=1)


endpoints = Table(
    "poller_endpoints",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("name", Text, nullable=False, unique=True),
    Column("url", Text, nullable=False),
    # A broker URL's user:password (poller/rules/destinations.py), sealed like secrets;
    # the url column holds it without them.
    Column("url_credentials", Text),
    Column("secret", Text, nullable=False),
    # During rotation the previous secret keeps signing until it expires.
    Column("previous_secret", Text),
    Column("previous_secret_expires_at", DateTime(timezone=True)),
    # Headers sent with every request (poller/endpoints/headers.py): credentials, sealed
    # like secrets.
    Column("headers", Text),
    # Its own retry schedule (seconds; the last repeats); NULL: POLLER_RETRY_SCHEDULE.
    Column("retry_schedule", ARRAY(Float)),
    # Seconds after its creation a message may still be sent; older ones end failed
    # ("expired") at their next claim. NULL: no limit.
    Column("max_age", Float),
    # TLS (poller/endpoints/tls.py): a client certificate (PEM) and its key, sealed like secrets,
    # for mutual TLS; a private CA bundle (PEM) the endpoint's certificate chains to.
    Column("client_cert", Text),
    Column("client_key", Text),
    Column("ca_bundle", Text),
    Column("lookup_url", Text),
    Column("enabled", Boolean, nullable=False, server_default=text("true")),
    Column("disabled_reason", Text),
    Column("max_attempts", Integer),
    Column("timeout", Float),
    Column("max_in_flight", Integer),
    Column("bucket", SmallInteger, nullable=False),
    # What a key does when its head fails for good: stop until an operator acts, or move on.
    Column("on_failed_head", Text, nullable=False, server_default=text("'block'")),
    # Endpoint health (poller/rules/health.py): requests per second across all pollers (and
    # the burst allowed), and overrides of POLLER_CIRCUIT_FAILURES / _COOLDOWN.
    Column("rate_limit", Float),
    Column("rate_burst", Integer),
    Column("circuit_failures", Integer),
    Column("circuit_cooldown", Float),
    # The claim statement skips the endpoint until then: CIRCUIT_HOLD while its circuit
    # is not closed, a Retry-After's end after a 429. Not a setting: updated_at stays.
    Column("paused_until", DateTime(timezone=True)),
    # An operator's pause (poller endpoints pause): while held_by is set, its messages
    # wait until held_until (NULL: until resumed); health, attempts, circuit untouched.
    Column("held_until", DateTime(timezone=True)),
    Column("held_by", Text),
    # Whether deliveries carry the message's trace context (traceparent) to it: off for
    # third parties that should not see the application's trace ids.
    Column("trace_context", Boolean, nullable=False, server_default=text("true")),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    # Fan-out (poller/outbox/publish.py): the event types published events reach it by (names
    # and ``prefix*`` patterns; none: only ``enqueue`` reaches it), its tenant (a
    # tenant's events reach only its endpoints; events without one only endpoints
    # without one), and a JSON object the payload must contain (``@>``).
    Column("event_types", ARRAY(Text), nullable=False, server_default=text("'{}'")),
    Column("tenant", Text),
    Column("payload_filter", JSONB(none_as_null=True)),
    CheckConstraint(f"bucket >= 0 AND bucket < {BUCKETS}", name="bucket_range"),
    CheckConstraint("on_failed_head IN ('block', 'skip')", name="on_failed_head_valid"),
    CheckConstraint("max_attempts IS NULL OR max_attempts >= 1", name="max_attempts_positive"),
    CheckConstraint("timeout IS NULL OR timeout > 0", name="timeout_positive"),
    CheckConstraint("max_age IS NULL OR max_age > 0", name="max_age_positive"),
    CheckConstraint("(client_cert IS NULL) = (client_key IS NULL)", name="client_cert_with_key"),
    CheckConstraint("max_in_flight IS NULL OR max_in_flight >= 1", name="max_in_flight_positive"),
    CheckConstraint(
        "rate_limit IS NULL OR (rate_limit >= 0.00001 AND rate_limit <= 1000000)",
        name="rate_limit_positive",
    ),
    CheckConstraint("rate_burst IS NULL OR rate_burst >= 1", name="rate_burst_positive"),
    CheckConstraint(
        "circuit_failures IS NULL OR circuit_failures >= 0", name="circuit_failures_not_negative"
    ),
    CheckConstraint(
        "circuit_cooldown IS NULL OR (circuit_cooldown > 0 AND circuit_cooldown <= 86400)",
        name="circuit_cooldown_positive",
    ),
    CheckConstraint(
        "payload_filter IS NULL OR jsonb_typeof(payload_filter) = 'object'",
        name="payload_filter_object",
    ),
    # publish() finds a tenant's endpoints (or those without a tenant: '') by this index.
    Index("ix_poller_endpoints_tenant", func.coalesce(text("tenant"), text("''"))),
    # ... and the endpoints subscribed to an event type (an array overlap, queries/publish.py).
    # fastupdate off: endpoints change rarely, and a pending list would be scanned by
    # every publish until the next VACUUM.
    Index(
        "ix_poller_endpoints_event_types",
        "event_types",
        postgresql_using="gin",
        postgresql_with={"fastupdate": "off"},
    ),
    # The governed claim (queries/claims.py) walks the rate-limited endpoints by bucket.
    Index(
        "ix_poller_endpoints_rate_limited",
        "bucket",
        "id",
        postgresql_where=text("rate_limit IS NOT NULL"),
    ),
)

# Published events (poller/outbox/publish.py): each kept once, however many endpoints it
# fans out to; their outbox rows reference it and carry no payload of their own.
# An idempotency key is unique within a tenant (and among events without one).
# An event's id comes from the outbox's id sequence: a key's position is the event's
# id for a published event's delivery and the message's id for an enqueued one, so
# positions on one key compare whichever way its messages came (poller/rows/ordering.py).
OUTBOX_ID_SEQUENCE = "poller_outbox_id_seq"

event_log = Table(
    "poller_events",
    metadata,
    Column(
        "id", BigInteger, primary_key=True, server_default=text(f"nextval('{OUTBOX_ID_SEQUENCE}')")
    ),
    Column("event_type", Text, nullable=False),
    # json, not jsonb: the exact text the application's payload serialized to.
    Column("payload", JSON, nullable=False),
    Column("idempotency_key", Text, nullable=False),
    Column("tenant", Text),
    Column("ordering_key", Text),
    # The application's W3C trace context when it published/enqueued inside a span
    # (poller/rules/tracing.py); a delivery continues that trace.
    Column("traceparent", Text),
    Column("tracestate", Text),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    # How many endpoints it reached when published (0 is allowed, and counted).
    Column("fanned_out", Integer, nullable=False, server_default=text("0")),
    # False when it was published through a door that could not check its payload
    # against its type's JSON Schema (SQL: poller_publish): the poller checks it first.
    Column("payload_checked", Boolean, nullable=False, server_default=text("true")),
    Index(
        "uq_poller_events_tenant_key",
        func.coalesce(text("tenant"), text("''")),
        "idempotency_key",
        unique=True,
    ),
    # Replay (a time window, oldest first) and retention.
    Index("ix_poller_events_created_at", "created_at", "id"),
)

outbox = Table(
    "poller_outbox",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column(
        "endpoint_id",
        BigInteger,
        ForeignKey("poller_endpoints.id", ondelete="RESTRICT"),
        nullable=False,
    ),
    Column("bucket", SmallInteger, nullable=False),
    Column("event_type", Text, nullable=False),
    # json, not jsonb: the exact text the application's payload serialized to.
    # NULL for a published event's delivery: the payload is its event's.
    Column("payload", JSON),
    Column("idempotency_key", Text, nullable=False),
    Column("status", Text, nullable=False, server_default=text("'pending'")),
    Column("attempts", Integer, nullable=False, server_default=text("0")),
    Column("max_attempts", Integer, nullable=False),
    # Attempts handed back by graceful shutdowns (bounded: poller/rules/outcomes.py MAX_REFUNDS).
    Column("refunds", Integer, nullable=False, server_default=text("0")),
    # attempts handed back after failed probes of an open circuit (poller/rules/health.py)
    Column("probe_refunds", Integer, nullable=False, server_default=text("0")),
    Column("next_attempt_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("claim_token", BigInteger),
    Column("claimed_by", Text),
    Column("claim_expires_at", DateTime(timezone=True)),
    Column("needs_lookup", Boolean, nullable=False, server_default=text("false")),
    Column("last_status_code", Integer),
    Column("last_error", Text),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("delivered_at", DateTime(timezone=True)),
    Column("failed_at", DateTime(timezone=True)),
    Column("cancelled_at", DateTime(timezone=True)),  # poller admin cancel
    # Ordered delivery: the key. A key's messages are inserted under its row lock in
    # poller_ordering_keys, so their ids grow in the order transactions took the key:
    # the id is the message's position in its key.
    Column("ordering_key", Text),
    # The application's W3C trace context when it published/enqueued inside a span
    # (poller/rules/tracing.py); a delivery continues that trace.
    Column("traceparent", Text),
    Column("tracestate", Text),
    # The published event this row delivers (poller/outbox/publish.py); NULL for enqueue's rows.
    Column("event_id", BigInteger, ForeignKey("poller_events.id", ondelete="RESTRICT")),
    UniqueConstraint("endpoint_id", "idempotency_key", name="uq_poller_outbox_endpoint_key"),
    CheckConstraint("payload IS NOT NULL OR event_id IS NOT NULL", name="payload_or_event"),
    CheckConstraint(
        "status IN ('waiting', 'pending', 'in_flight', 'delivered', 'failed', 'cancelled')",
        name="status_valid",
    ),
    CheckConstraint("status <> 'waiting' OR ordering_key IS NOT NULL", name="waiting_is_ordered"),
    CheckConstraint("attempts >= 0", name="attempts_not_negative"),
    CheckConstraint("max_attempts >= 1", name="max_attempts_positive"),
    CheckConstraint(
        "status <> 'in_flight' OR (claim_token IS NOT NULL AND claim_expires_at IS NOT NULL)",
        name="in_flight_is_claimed",
    ),
    # The claim path reads each endpoint's due pending rows, in due order, by bucket and
    # endpoint; the claim's walk takes the endpoints with pending rows by bucket (a
    # poller walks its own buckets only). Every read of an endpoint's pending rows
    # gives its bucket.
    Index(
        "ix_poller_outbox_bucket_due",
        "bucket",
        "endpoint_id",
        "next_attempt_at",
        "id",
        postgresql_where=text("status = 'pending'"),
    ),
    # The reclaim path reads only in-flight rows, by lease expiry.
    Index(
        "ix_poller_outbox_reclaim",
        "claim_expires_at",
        postgresql_where=text("status = 'in_flight'"),
    ),
    # The next message of a key, when its head ends: waiting rows only, by position.
    Index(
        "ix_poller_outbox_waiting",
        "endpoint_id",
        "ordering_key",
        "id",
        postgresql_where=text("status = 'waiting'"),
    ),
    # Admin listing of failures and retention purges by age.
    Index("ix_poller_outbox_failed", "failed_at", postgresql_where=text("status = 'failed'")),
    # One endpoint's failures, newest first (the dashboard's failed list).
    Index(
        "ix_poller_outbox_failed_endpoint",
        "endpoint_id",
        "failed_at",
        "id",
        postgresql_where=text("status = 'failed'"),
    ),
    Index(
        "ix_poller_outbox_delivered", "delivered_at", postgresql_where=text("status = 'delivered'")
    ),
    Index(
        "ix_poller_outbox_cancelled", "cancelled_at", postgresql_where=text("status = 'cancelled'")
    ),
    # An event's deliveries (admin show, replay, the events' retention).
    Index("ix_poller_outbox_event", "event_id", postgresql_where=text("event_id IS NOT NULL")),
)

delivery_attempts = Table(
    "poller_delivery_attempts",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column(
        "message_id",
        BigInteger,
        ForeignKey("poller_outbox.id", ondelete="CASCADE"),
        nullable=False,
    ),
    # The message's endpoint, so per-endpoint ratios need no join with the outbox
    # (NULL on attempts older than migration 0009's day of backfill).
    Column("endpoint_id", BigInteger),
    Column("attempt", Integer, nullable=False),
    Column("kind", Text, nullable=False),
    Column("claim_token", BigInteger),
    Column("poller_id", Text),
    Column("started_at", DateTime(timezone=True)),
    Column("finished_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("duration_ms", Float),
    # delivered | retry | unknown | failed | lease_expired | manual | lookup_* ...
    Column("outcome", Text, nullable=False),
    Column("status_code", Integer),
    Column("error_class", Text),
    Column("error_message", Text),
    Column("response_excerpt", Text),
    # True when the write was fenced out: the attempt happened on the wire, but
    # its claim had been superseded, so the row was not changed by it.
    Column("stale", Boolean, nullable=False, server_default=text("false")),
    CheckConstraint("kind IN ('send', 'lookup', 'manual', 'expiry', 'refusal')", name="kind_valid"),
    Index("ix_poller_delivery_attempts_message", "message_id", "id"),
    # Success ratios over the last hour/day (``endpoints health``): rows arrive in
    # time order, so a BRIN index is tiny and nearly free to maintain.
    Index("ix_poller_delivery_attempts_finished_at", "finished_at", postgresql_using="brin"),
)


# Keys of purged messages, kept for POLLER_RETENTION_KEYS: re-enqueueing one is refused
# (the message was delivered or failed already) instead of starting a second message.
spent_keys = Table(
    "poller_spent_keys",
    metadata,
    Column(
        "endpoint_id",
        BigInteger,
        ForeignKey("poller_endpoints.id", ondelete="CASCADE"),
        primary_key=True,
    ),
    Column("idempotency_key", Text, primary_key=True),
    Column("purged_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Index("ix_poller_spent_keys_purged_at", "purged_at"),
)


# One row per (endpoint, ordering key) that has an open message: the lock that
# orders the key's enqueues and hand-overs, and the head (the open message every later
# one waits behind). The row goes when the key's last message ends, so the table
# holds only live keys. ``head_id`` is NULL only inside the enqueue that created the
# row; ``blocked_since`` is set while the head has failed on a ``block`` endpoint.
# No index but the primary key and the blocked one: a hand-over is a HOT update.
ordering_keys = Table(
    "poller_ordering_keys",
    metadata,
    Column(
        "endpoint_id",
        BigInteger,
        ForeignKey("poller_endpoints.id", ondelete="CASCADE"),
        primary_key=True,
    ),
    Column("ordering_key", Text, primary_key=True),
    Column("head_id", BigInteger),
    Column("blocked_since", DateTime(timezone=True)),
    Index(
        "ix_poller_ordering_keys_blocked",
        "blocked_since",
        postgresql_where=text("blocked_since IS NOT NULL"),
    ),
)


# Each endpoint's health, shared by every poller (poller/rules/health.py); a row per
# endpoint, made with it by a trigger (migrations 0007, 0025). ``state``: closed
# (deliver), open (claim nothing until ``open_until``), half_open (one probe out
# since ``probe_at``). ``cooldown``: the open period in force, doubled (capped) on
# each failed probe. ``failing_since``: the first failed send after the last
# success (auto-disable). ``tokens`` at ``tokens_at``: the rate limit's bucket.
endpoint_health = Table(
    "poller_endpoint_health",
    metadata,
    Column(
        "endpoint_id",
        BigInteger,
        ForeignKey("poller_endpoints.id", ondelete="CASCADE"),
        primary_key=True,
    ),
    Column("state", Text, nullable=False, server_default=text("'closed'")),
    Column("consecutive_failures", Integer, nullable=False, server_default=text("0")),
    Column("cooldown", Float),
    Column("opened_at", DateTime(timezone=True)),
    Column("open_until", DateTime(timezone=True)),
    Column("probe_at", DateTime(timezone=True)),
    Column("opens", BigInteger, nullable=False, server_default=text("0")),
    Column("probes", BigInteger, nullable=False, server_default=text("0")),
    Column("last_success_at", DateTime(timezone=True)),
    Column("last_failure_at", DateTime(timezone=True)),
    Column("failing_since", DateTime(timezone=True)),
    Column("last_error", Text),
    Column("tokens", Float, nullable=False, server_default=text("0")),
    Column("tokens_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    # Every failed request the breaker counted, ever (never reset): the fault hunt
    # checks it against the attempt rows.
    Column("failed_requests", BigInteger, nullable=False, server_default=text("0")),
    # Its endpoint's bucket (a trigger fills it in, however the row is made, and
    # another keeps it if the endpoint's changes): the governed claim walks the
    # circuits not closed of its own buckets.
    Column("bucket", SmallInteger, nullable=False),
    CheckConstraint("state IN ('closed', 'open', 'half_open')", name="state_valid"),
    # ... and the circuits not closed.
    Index(
        "ix_poller_endpoint_health_not_closed",
        "bucket",
        "endpoint_id",
        postgresql_where=text("state <> 'closed'"),
    ),
)

# What completions told an endpoint's health while its rows were busy (locked by
# another completion or an operator): written in the completion's transaction,
# folded into the health row by the next JUDGE_HEALTH that can lock it. So a
# completion never waits for those rows, and no failed request goes uncounted.
health_backlog = Table(
    "poller_health_backlog",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("endpoint_id", BigInteger, nullable=False),
    Column("ok", Integer, nullable=False),
    Column("bad", Integer, nullable=False),
    Column("pause", Float),
    Column("gone", Text),
    Column("error", Text),
    Index("ix_poller_health_backlog_endpoint", "endpoint_id"),
)
CIRCUIT_STATES = ("closed", "open", "half_open")
# ``paused_until`` while a circuit is not closed: far enough to mean "until a probe
# closes it", near enough that every client reads it as a datetime ('infinity' is not).
CIRCUIT_HOLD = "9000-01-01 UTC"  # no colon: raw-psycopg rewrites (loadtest) would see a parameter
