"""webhook-poller: a transactional outbox delivered as signed webhooks.

The public API: enqueue (to one named endpoint) or publish (to every subscribed
endpoint) inside your transaction, and the settings and errors.

    from poller import enqueue
    enqueue(session, endpoint="billing", event_type="invoice.paid",
            payload={"invoice": 42}, idempotency_key="invoice:42:paid")
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from poller.errors import (
    ConfigurationError,
    EndpointDisabled,
    EndpointExists,
    EnqueueError,
    EventConflict,
    IdempotencyConflict,
    IdempotencyKeySpent,
    InvalidEndpoint,
    InvalidEventType,
    InvalidIdempotencyKey,
    InvalidOrderingKey,
    InvalidPayload,
    InvalidSubscription,
    InvalidTenant,
    NaiveDatetime,
    PayloadTooLarge,
    PollerError,
    UnknownEndpoint,
)
from poller.outbox import (
    Message,
    enqueue,
    enqueue_async,
    enqueue_many,
    enqueue_many_async,
)
from poller.payloads import RawJSON
from poller.publish import (
    Event,
    Published,
    publish,
    publish_async,
    publish_many,
    publish_many_async,
)
from poller.settings import Settings, load_settings

try:
    __version__ = version("webhook-poller")
except PackageNotFoundError:  # pragma: no cover - running from a bare source tree
    __version__ = "0.0.0"

__all__ = [
    "ConfigurationError",
    "EndpointDisabled",
    "EndpointExists",
    "EnqueueError",
    "Event",
    "EventConflict",
    "IdempotencyConflict",
    "IdempotencyKeySpent",
    "InvalidEndpoint",
    "InvalidEventType",
    "InvalidIdempotencyKey",
    "InvalidOrderingKey",
    "InvalidPayload",
    "InvalidSubscription",
    "InvalidTenant",
    "Message",
    "NaiveDatetime",
    "PayloadTooLarge",
    "PollerError",
    "Published",
    "RawJSON",
    "Settings",
    "UnknownEndpoint",
    "__version__",
    "enqueue",
    "enqueue_async",
    "enqueue_many",
    "enqueue_many_async",
    "load_settings",
    "publish",
    "publish_async",
    "publish_many",
    "publish_many_async",
]
