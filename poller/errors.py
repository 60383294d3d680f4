"""Typed exceptions: every failure webhook-poller expects is one of these.

All derive from :class:`PollerError`; input errors also derive from
:class:`ValueError`, and "no such thing" errors from :class:`NotFound` (a
:class:`LookupError`), so callers that only know the builtin hierarchy still
catch them. The tree (tests/unit/test_validation.py checks it is the classes')::

    PollerError
    ├── AddressRefused                 (OSError) a connection private-target refusal forbids
    ├── ConfigurationError             (ValueError) a setting, named by its variable
    │   └── PortalNotConfigured
    ├── ConnectionNotSupported         (TypeError) not a connection a door takes
    ├── ElectionUnavailable            the election's backend cannot be reached
    ├── EmbeddedServerError            (RuntimeError)
    ├── EndpointExists
    ├── EndpointInUse
    │   └── EndpointBusy
    ├── EnqueueError                   (ValueError) refused before anything was written
    │   ├── EndpointDisabled
    │   ├── InvalidEventType
    │   ├── InvalidIdempotencyKey
    │   ├── InvalidOrderingKey
    │   ├── InvalidPayload
    │   │   ├── PayloadInvalid
    │   │   └── PayloadTooLarge
    │   ├── InvalidTenant
    │   └── NaiveDatetime
    ├── IdempotencyConflict
    │   └── EventConflict
    ├── IdempotencyKeySpent
    ├── InvalidEndpoint                (ValueError)
    │   ├── InvalidSubscription
    │   └── PrivateTarget
    ├── InvalidInput                   (ValueError) what a person typed
    │   └── InvalidHost
    ├── InvalidReplay                  (ValueError)
    ├── NotAllowed                     a tenant changing what is the operator's
    ├── NotFound                       (LookupError)
    │   ├── EventNotFound
    │   ├── EventTypeNotFound
    │   ├── MessageNotFound
    │   ├── NothingMatched
    │   ├── TokenNotFound
    │   └── UnknownEndpoint
    ├── RequestConflict
    ├── RequestRefused                 a web request a face will not take (its HTTP status)
    ├── SchemaTooCostly                a payload's check ran out of steps
    ├── SecretUnreadable
    ├── SendError                      a delivery's exchange failed (``sent``: maybe seen)
    ├── ServiceCrashed                 (RuntimeError)
    ├── TenantFull
    ├── TokenExists
    └── TokenRefused

Each face maps them once: the CLI (``poller/cli/__init__.py``) exits 1 for
:class:`NotFound`, 2 for any other :class:`PollerError` and 70 for anything
else (a bug, never reported as "not found"); the dashboard answers 404 for
:class:`NotFound` and 400 for any other; the API answers a problem per class; anything
else is a bug (500, logged). Nothing outside this module defines an exception.
"""

from __future__ import annotations

import errno

from poller.redact import scrub_urls


class PollerError(Exception):
    """Base class of every error webhook-poller raises on purpose."""


class NotFound(PollerError, LookupError):
    """The thing asked for does not exist (or nothing matched what was asked)."""


class InvalidInput(PollerError, ValueError):
    """A value a person typed (a duration, a time, an id, JSON) cannot be read."""


class ConfigurationError(PollerError, ValueError):
    """A setting is invalid. The message names the environment variable."""


class ConnectionNotSupported(PollerError, TypeError):
    """enqueue, publish or their _async forms were given a connection they do not take
    (poller/outbox/doors.py lists those they do)."""


class EmbeddedServerError(PollerError, RuntimeError):
    """An embedded PostgreSQL or Redis server could not be started or stopped."""


# --- enqueue -----------------------------------------------------------------


class EnqueueError(PollerError, ValueError):
    """The message was refused before anything was written."""


class UnknownEndpoint(NotFound):
    """No endpoint has this name."""

    def __init__(self, name: str) -> None:
        super().__init__(f"unknown endpoint {name!r}")
        self.name = name


class EndpointDisabled(EnqueueError):
    """The endpoint exists but is disabled; enable it before enqueueing."""

    def __init__(self, name: str, reason: str | None) -> None:
        why = f": {reason}" if reason else ""
        super().__init__(f"endpoint {name!r} is disabled{why}")
        self.name = name
        self.reason = reason


class InvalidPayload(EnqueueError):
    """The payload cannot be stored as JSON (not serialisable, NaN, NUL characters)."""


class PayloadTooLarge(InvalidPayload):
    """The serialised payload is over the size limit (``POLLER_MAX_PAYLOAD_BYTES``)."""


class InvalidIdempotencyKey(EnqueueError):
    """The idempotency key is empty, too long, or has characters a header cannot carry."""


class InvalidOrderingKey(EnqueueError):
    """The ordering key is empty, too long, or has characters a header cannot carry."""


class InvalidEventType(EnqueueError):
    """The event type is empty, too long, or has control characters."""


class NaiveDatetime(EnqueueError):
    """A datetime without a timezone was given where an instant is required."""


class IdempotencyConflict(PollerError):
    """The (endpoint, idempotency key) exists already with other content (payload, event
    type or ordering key)."""

    def __init__(self, endpoint: str, idempotency_key: str, existing_id: int) -> None:
        super().__init__(
            f"idempotency key {idempotency_key!r} on endpoint {endpoint!r} is already used by "
            f"message {existing_id} with a different payload, event type or ordering key"
        )
        self.endpoint = endpoint
        self.idempotency_key = idempotency_key
        self.existing_id = existing_id


class IdempotencyKeySpent(PollerError):
    """The key belonged to a message that was delivered or failed and then purged.

    Spent keys are kept for ``POLLER_RETENTION_KEYS`` so a late retry of the
    application's transaction cannot start a second message with the same key.
    """

    def __init__(self, endpoint: str, idempotency_key: str) -> None:
        super().__init__(
            f"idempotency key {idempotency_key!r} on endpoint {endpoint!r} was used by a message "
            "that has been purged; it cannot start a new message (POLLER_RETENTION_KEYS)"
        )
        self.endpoint = endpoint
        self.idempotency_key = idempotency_key


class InvalidTenant(EnqueueError):
    """The tenant is empty, too long, or has characters other than visible ASCII."""


class EventConflict(IdempotencyConflict):
    """An event with this idempotency key (in this tenant) was published already with
    other content (payload, event type or ordering key)."""

    def __init__(self, tenant: str | None, idempotency_key: str, existing_id: int) -> None:
        where = f"in tenant {tenant!r}" if tenant is not None else "(no tenant)"
        PollerError.__init__(
            self,
            f"idempotency key {idempotency_key!r} {where} is already used by event "
            f"{existing_id} with a different payload, event type or ordering key",
        )
        self.endpoint = ""
        self.tenant = tenant
        self.idempotency_key = idempotency_key
        self.existing_id = existing_id


class RequestConflict(PollerError):
    """An API request's ``Idempotency-Key`` was used before for a different request
    (poller/web/api/once.py)."""


# --- endpoints ---------------------------------------------------------------


class InvalidEndpoint(PollerError, ValueError):
    """An endpoint's name, URL or limits are invalid."""


class InvalidSubscription(InvalidEndpoint):
    """An endpoint's event types, tenant or payload filter are invalid."""


class PrivateTarget(InvalidEndpoint):
    """A URL points at a private, loopback or link-local address. ``hint`` names the
    setting that allows it, for the operator's faces (the CLI, an admin's API call);
    a tenant is told only that the address is refused."""

    hint = "set POLLER_ALLOW_PRIVATE_TARGETS=true to allow it"


class EndpointExists(PollerError):
    """An endpoint with this name exists already."""

    def __init__(self, name: str) -> None:
        super().__init__(f"endpoint {name!r} exists already")
        self.name = name


class TenantFull(PollerError):
    """The tenant has as many endpoints as it may make (POLLER_TENANT_MAX_ENDPOINTS)."""

    def __init__(self, tenant: str, limit: int) -> None:
        super().__init__(
            f"tenant {tenant!r} has {limit} endpoints, as many as it may make: remove one "
            "first (an operator can raise POLLER_TENANT_MAX_ENDPOINTS)"
        )
        self.tenant, self.limit = tenant, limit


class NotAllowed(PollerError):
    """The caller may not do this: a tenant setting what is the operator's to set
    (capacity, retry policy)."""


class EndpointInUse(PollerError):
    """The endpoint still has messages; remove it with force to delete them too."""


class EndpointBusy(EndpointInUse):
    """A forced removal found messages still held past its wait (in flight, or locked by
    another transaction): the endpoint stays disabled, and removing it again finishes."""


class SecretUnreadable(PollerError):
    """An endpoint's stored signing secret cannot be opened with the keys at hand."""


# --- operating -----------------------------------------------------------------


class MessageNotFound(NotFound):
    """No message has this id (or key on this endpoint)."""


class EventNotFound(NotFound):
    """No published event has this id (or it was purged)."""


class NothingMatched(NotFound):
    """An operation found nothing to act on (no message to retry, no event to replay)."""


class InvalidReplay(PollerError, ValueError):
    """A replay's window or batch cannot be used (a naive time, a batch below 1)."""


class ServiceCrashed(PollerError, RuntimeError):
    """A loop of the poller crashed; the poller stopped gracefully and must be restarted."""


class TokenNotFound(NotFound):
    """No API token has this name (poller/access/tokens.py)."""


class TokenExists(PollerError):
    """An API token of this name exists already (names are kept after a revoke)."""


class TokenRefused(PollerError):
    """A presented API token is not one, or is expired or revoked: the API answers 401.

    Its message never repeats the token."""


class PayloadInvalid(InvalidPayload):
    """The payload does not match its event type's schema (poller/outbox/catalog.py); nothing
    was published. ``errors``: where and why, the first few."""

    def __init__(self, message: str, errors: list[str] | None = None) -> None:
        super().__init__(message)
        self.errors = errors or []


class EventTypeNotFound(NotFound):
    """The catalog has no event type of this name."""


class PortalNotConfigured(ConfigurationError):
    """No portal key: POLLER_PORTAL_KEY is unset on a configured database."""


class InvalidHost(InvalidInput):
    """A host that looks numeric but is no valid IPv4 address (e.g. ``1.2.3.256``)."""


class AddressRefused(PollerError, OSError):
    """A delivery would connect to an address that private-target refusal forbids
    (poller/endpoints/netguard.py). An ``OSError``, as the HTTP clients expect of a socket."""

    def __init__(self, message: str) -> None:
        OSError.__init__(self, errno.EACCES, message)  # strerror carries it into client errors


class ElectionUnavailable(PollerError):
    """The election's backend (Redis or PostgreSQL) could not be reached."""


class SendError(PollerError):
    """A delivery's exchange failed (poller/deliver/wire.py); ``sent`` tells whether the receiver
    may have the request."""

    def __init__(self, error_class: str, message: str, *, sent: bool) -> None:
        # Every sender's words go through here to error_message, logs and events: a
        # URL in them (clients quote the one they were given) shows no path or query.
        super().__init__(scrub_urls(message))
        self.error_class = error_class
        self.sent = sent


class SchemaTooCostly(PollerError):
    """Checking a payload against a JSON Schema ran out of its steps
    (poller/outbox/json_schemas.py): reported as the payload's refusal."""


class RequestRefused(PollerError):
    """A web request a face will not take before it reaches the core (no JSON body, too
    large, read-only caller…): answered as the problem ``status`` with ``detail``."""

    def __init__(self, status: int, detail: str, errors: list[dict[str, str]] | None = None):
        super().__init__(detail)
        self.status, self.detail, self.errors = status, detail, errors


# --- the SQL doors' SQLSTATEs ----------------------------------------------------

SQLSTATES: dict[str, type[PollerError]] = {
    "WP000": EnqueueError,
    "WP001": UnknownEndpoint,
    "WP002": EndpointDisabled,
    "WP003": InvalidEventType,
    "WP004": InvalidIdempotencyKey,
    "WP005": InvalidOrderingKey,
    "WP006": InvalidPayload,
    "WP007": PayloadTooLarge,
    "WP008": PayloadInvalid,
    "WP009": InvalidTenant,
    "WP010": NaiveDatetime,
    "WP011": IdempotencyConflict,
    "WP012": EventConflict,
    "WP013": IdempotencyKeySpent,
}
"""The SQLSTATE each error of a write into the outbox carries when the database's
functions raise it (db/sql/0026_doors.sql; docs/reference/sql.md): class ``WP``, one
per class. ``WP008`` (a payload its type's JSON Schema refuses) and ``WP010`` (a naive
datetime) come from the Python doors only: SQL has no naive ``timestamptz``, and the
database cannot check a JSON Schema (the poller does, before sending)."""


def from_sqlstate(sqlstate: str, message: str, detail: str | None) -> PollerError:
    """The error a refusal of the SQL doors is: its class by ``sqlstate``, built from the
    JSON ``detail`` where the class has fields (the endpoint, the key, the message it
    clashes with), else with the database's ``message``."""
    import json

    try:
        facts = json.loads(detail or "{}")
    except ValueError:
        facts = {}
    if not isinstance(facts, dict):
        facts = {}
    cls = SQLSTATES.get(sqlstate)
    if cls is UnknownEndpoint:
        return UnknownEndpoint(str(facts.get("endpoint", "?")))
    if cls is EndpointDisabled:
        return EndpointDisabled(str(facts.get("endpoint", "?")), facts.get("reason"))
    if cls is EventConflict:
        return EventConflict(facts.get("tenant"), str(facts.get("idempotency_key", "?")),
                             int(facts.get("existing_id", -1)))  # fmt: skip
    if cls is IdempotencyConflict:
        return IdempotencyConflict(str(facts.get("endpoint", "?")),
                                   str(facts.get("idempotency_key", "?")),
                                   int(facts.get("existing_id", -1)))  # fmt: skip
    if cls is IdempotencyKeySpent:
        return IdempotencyKeySpent(str(facts.get("endpoint", "(every endpoint)")),
                                   str(facts.get("idempotency_key", "?")))  # fmt: skip
    return (cls or EnqueueError)(message)
