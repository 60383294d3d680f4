"""The shapes of the management API's bodies, in and out: what each route reads is
checked against its shape (poller/web/api/rest.py), and the OpenAPI document
(poller/web/api/openapi.py) is made from them, so the two cannot drift apart.

They are ``TypedDict``\\ s, checked by pydantic in strict mode: a field of the wrong
JSON type, ``null`` where a value is asked for, NaN or an infinity, or a field the
shape does not have is a 422 naming the field, never a crash further in. The values
themselves (a URL's host, a name's characters, a duration's bounds) are checked by
the functions the routes call, as for the Python API. A shape a route only answers
with is not checked at run time; tests/integration/test_api.py checks the answers
against the document.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, NotRequired, Required

from pydantic import ConfigDict
from typing_extensions import TypedDict

STRICT = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
"""What every request shape is checked with."""

Seconds = float
When = str
"""A moment: an ISO 8601 time with its offset, or a duration ago (``90s``, ``2h``, ``7d``)."""


# --- endpoints ------------------------------------------------------------------------


class EndpointSettings(TypedDict, total=False):
    """What a create or a change may set (each field as in the Python API's
    ``create_endpoint``)."""

    __pydantic_config__ = STRICT  # type: ignore[misc]
    url: str
    """Where its webhooks go: ``https://`` (``http://`` only where allowed)."""
    lookup_url: str
    """Where a delivery whose outcome is unknown is looked up (``GET``, 200 or 404)."""
    event_types: list[str]
    """Published event types it receives: names, and ``prefix*``."""
    tenant: str
    """Only events published for this tenant reach it (an admin's token only)."""
    payload_filter: dict[str, Any]
    """A JSON object a published event's payload must contain to reach it."""
    headers: dict[str, str]
    """Headers every delivery carries (their values are never shown again)."""
    max_attempts: int
    """Attempts before a message ends ``failed``."""
    timeout: Seconds
    """How long a send may take."""
    max_in_flight: int
    """At most this many of its deliveries at once."""
    rate_limit: float
    """Requests a second across all pollers."""
    rate_burst: int
    """Requests the rate limit allows at once."""
    circuit_failures: int
    """Failed sends in a row that open its circuit (0: never)."""
    circuit_cooldown: Seconds
    """How long its circuit stays open before a probe."""
    retry_schedule: list[Seconds]
    """Seconds between attempts; the last repeats."""
    max_age: Seconds
    """How long after its creation a message may still be sent: 1 s to 365 days."""
    on_failed_head: Literal["block", "skip"]
    """What an ordering key does when its head fails for good."""
    trace_context: bool
    """Whether deliveries carry the message's trace context."""
    client_cert: str
    """mTLS: the PEM certificate (chain) it presents to the receiver."""
    client_key: str
    """mTLS: the certificate's PEM private key (stored sealed, never shown)."""
    ca_bundle: str
    """PEM certificates it trusts for this receiver instead of the system's."""


class EndpointNew(EndpointSettings, total=False):
    """A new endpoint. An admin names it; a tenant's token gets one named for it."""

    __pydantic_config__ = STRICT  # type: ignore[misc]
    url: Required[str]  # type: ignore[misc]
    name: str
    signing: Literal["hmac-sha256", "ed25519"]
    """How its deliveries are signed (default ``hmac-sha256``)."""


class TLSCertificate(TypedDict):
    subject: str
    issuer: str
    expires: datetime


class TLS(TypedDict):
    client_cert: TLSCertificate | None
    ca_bundle: list[str] | None
    """The subjects of the certificates it trusts for this endpoint."""


class Pause(TypedDict):
    until: datetime | None
    """None: until resumed."""
    by: str | None


class Endpoint(TypedDict):
    """An endpoint: never a secret, a private key or a header's value."""

    name: str
    url: str
    lookup_url: str | None
    enabled: bool
    disabled_reason: str | None
    max_attempts: int | None
    """None: the poller's default (``POLLER_MAX_ATTEMPTS``); so for the fields below."""
    timeout: Seconds | None
    max_in_flight: int | None
    bucket: int
    on_failed_head: str
    rate_limit: float | None
    rate_burst: int | None
    circuit_failures: int | None
    circuit_cooldown: Seconds | None
    event_types: list[str]
    tenant: str | None
    payload_filter: dict[str, Any] | None
    created_at: datetime
    previous_secret_expires_at: datetime | None
    """Until when the secret before the last rotation signs too."""
    secret_encrypted: bool
    signing: str
    public_keys: list[str]
    """ed25519: the keys a receiver verifies with (after a rotation, the old one too)."""
    headers: list[str]
    """The names of its headers (their values are credentials)."""
    retry_schedule: list[Seconds] | None
    max_age: Seconds | None
    trace_context: bool
    tls: TLS | None
    paused: Pause | None


class EndpointKeyed(Endpoint):
    """An endpoint just made, or whose key was just rotated."""

    secret: NotRequired[str]
    """hmac-sha256: its signing secret, shown this once (``whsec_…``)."""
    note: NotRequired[str]
    """A create sent again with its ``Idempotency-Key``: why the secret is not here (only
    the first answer carried it)."""


class EndpointPage(TypedDict):
    data: list[Endpoint]
    next: str | None
    """The ``after`` of the next page; None: this is the last."""


class PauseRequest(TypedDict, total=False):
    """How long to hold its deliveries; no ``until``: until resumed."""

    __pydantic_config__ = STRICT  # type: ignore[misc]
    until: When
    """A time, or a duration from now (``2h``)."""


class RotateRequest(TypedDict, total=False):
    """A new signing key; the old one signs too for ``keep_old_for``."""

    __pydantic_config__ = STRICT  # type: ignore[misc]
    keep_old_for: str
    """A duration (default ``24h``; ``0s``: the old key stops now)."""
    signing: Literal["hmac-sha256", "ed25519"]
    """Switch schemes with the rotation."""


class NoFields(TypedDict):
    """An empty object (or no body at all)."""

    __pydantic_config__ = STRICT  # type: ignore[misc]


class Removed(TypedDict):
    name: str
    deleted_messages: int


class TestSent(TypedDict):
    message_id: int
    idempotency_key: str


class ReplayRequest(TypedDict, total=False):
    """Deliver again the events published in [since, until) the endpoint is subscribed
    to now: those it never had are queued, those that ended are sent again."""

    __pydantic_config__ = STRICT  # type: ignore[misc]
    since: Required[When]
    until: When
    event_type: str
    dry_run: bool
    """Count, change nothing."""


class Replayed(TypedDict):
    events: int
    """Events in the window it is subscribed to."""
    queued: int
    """New deliveries."""
    resent: int
    """Ended deliveries sent again."""
    open: int
    """Deliveries still open, left alone."""
    taken: int
    """Keys held by a message enqueued for the endpoint, left alone."""
    batches: int
    dry_run: bool


# --- messages --------------------------------------------------------------------------


class Message(TypedDict):
    """One delivery to one endpoint."""

    id: int
    endpoint: str
    event_type: str
    idempotency_key: str
    status: Literal["pending", "in_flight", "waiting", "delivered", "failed", "cancelled"]
    attempts: int
    max_attempts: int
    next_attempt_at: datetime
    last_status_code: int | None
    last_error: str | None
    created_at: datetime
    delivered_at: datetime | None
    failed_at: datetime | None
    cancelled_at: datetime | None
    ordering_key: str | None
    event_id: int | None
    """The published event it delivers; None: enqueued for this endpoint alone."""


class MessagePage(TypedDict):
    data: list[Message]
    next: str | None


class Attempt(TypedDict):
    """One attempt: a send, a lookup, or an operator's action."""

    attempt: int
    kind: str
    outcome: str
    started_at: datetime | None
    duration_ms: float | None
    status_code: int | None
    error_class: str | None
    error_message: str | None
    response_excerpt: str | None
    """The start of the receiver's answer."""


class MessageDetail(Message):
    payload: Any
    """The JSON object as sent; its text (a string) for a stored payload no value can
    be made of: nested past 127 levels or with an integer past 4,300 digits (a row
    written by SQL, or before enqueue refused them)."""
    attempts_log: list[Attempt]
    """Oldest first."""


class MessageState(TypedDict):
    id: int
    status: str


# --- events ----------------------------------------------------------------------------


class EventNew(TypedDict, total=False):
    """An event to publish, as ``poller.publish()`` takes it: one delivery to each
    endpoint subscribed to it. Publishing a key again adds nothing."""

    __pydantic_config__ = STRICT  # type: ignore[misc]
    event_type: Required[str]
    payload: Required[Any]
    idempotency_key: Required[str]
    tenant: str | None
    """None: for endpoints without a tenant. A tenant's token publishes as its tenant."""
    ordering_key: str | None
    """Events with one key reach each endpoint in publish order."""


class Published(TypedDict):
    event_id: int
    deliveries: dict[str, int]
    """The message id of its delivery to each endpoint, by endpoint name."""
    created: bool
    """False: published before with this key; nothing was added."""


class Delivery(TypedDict):
    id: int
    endpoint: str
    status: str
    attempts: int
    max_attempts: int
    last_status_code: int | None
    last_error: str | None
    created_at: datetime
    delivered_at: datetime | None
    failed_at: datetime | None


class Event(TypedDict):
    """A published event and its delivery to each endpoint."""

    id: int
    event_type: str
    payload: Any
    """The JSON object as sent; its text (a string) for a stored payload no value can
    be made of: nested past 127 levels or with an integer past 4,300 digits (a row
    written by SQL, or before enqueue refused them)."""
    idempotency_key: str
    tenant: str | None
    ordering_key: str | None
    created_at: datetime
    deliveries: list[Delivery]


class EventReplay(TypedDict):
    """Deliver this event to an endpoint subscribed to it, again or for the first time."""

    __pydantic_config__ = STRICT  # type: ignore[misc]
    endpoint: str


# --- the catalog -----------------------------------------------------------------------


class EventTypeDefinition(TypedDict, total=False):
    """An event type's entry in the catalog; with a ``schema``, payloads are checked."""

    __pydantic_config__ = STRICT  # type: ignore[misc]
    description: str
    schema: dict[str, Any]
    """A JSON Schema (2020-12) every payload of this type must meet."""
    example: Any
    deprecated: bool


class EventType(TypedDict):
    name: str
    description: str | None
    schema: dict[str, Any] | None
    example: Any
    deprecated: bool
    created_at: datetime
    updated_at: datetime


class EventTypePage(TypedDict):
    data: list[EventType]
    next: str | None


class EventTypeRemoved(TypedDict):
    name: str
    removed: bool


# --- problems --------------------------------------------------------------------------


class FieldProblem(TypedDict):
    field: str
    """Where, in JSON Pointer form (``/headers/X-Token``)."""
    message: str


class Problem(TypedDict):
    """An error (RFC 9457)."""

    type: str
    title: str
    status: int
    detail: str
    errors: NotRequired[list[FieldProblem]]
    """For a body that does not fit its shape: each field that does not."""
