"""webhook-poller: a transactional outbox delivered as signed webhooks.

The public API: enqueue (to one named endpoint) or publish (to every subscribed
endpoint) inside your transaction, and the settings and errors.

The errors are imported at once; every other name when first used (PEP 562),
so ``import poller`` costs next to nothing and the ``poller`` command starts at once; an application
that enqueues pulls in SQLAlchemy and the payload encoder, never the web,
HTTP or metrics stacks.

    from poller import enqueue
    enqueue(session, endpoint="billing", event_type="invoice.paid",
            payload={"invoice": 42}, idempotency_key="invoice:42:paid")
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

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
    PayloadInvalid,
    PayloadTooLarge,
    PollerError,
    UnknownEndpoint,
)

if TYPE_CHECKING:
    from poller.access.portal import portal_link
    from poller.outbox.catalog import define_event_type
    from poller.outbox.enqueue import (
        Message,
        enqueue,
        enqueue_async,
        enqueue_many,
        enqueue_many_async,
    )
    from poller.outbox.publish import (
        Event,
        Published,
        publish,
        publish_async,
        publish_many,
        publish_many_async,
    )
    from poller.rules.payloads import RawJSON
    from poller.settings import Settings, load_settings

_LAZY = {
    "Event": "poller.outbox.publish",
    "Message": "poller.outbox.enqueue",
    "Published": "poller.outbox.publish",
    "RawJSON": "poller.rules.payloads",
    "define_event_type": "poller.outbox.catalog",
    "portal_link": "poller.access.portal",
    "Settings": "poller.settings",
    "enqueue": "poller.outbox.enqueue",
    "enqueue_async": "poller.outbox.enqueue",
    "enqueue_many": "poller.outbox.enqueue",
    "enqueue_many_async": "poller.outbox.enqueue",
    "load_settings": "poller.settings",
    "publish": "poller.outbox.publish",
    "publish_async": "poller.outbox.publish",
    "publish_many": "poller.outbox.publish",
    "publish_many_async": "poller.outbox.publish",
}


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from poller.rules.version import version

        found = version()
    elif name in _LAZY:
        found = getattr(importlib.import_module(_LAZY[name]), name)
    else:
        raise AttributeError(f"module 'poller' has no attribute {name!r}")
    globals()[name] = found  # once: later lookups do not come here
    return found


def __dir__() -> list[str]:
    return sorted(__all__)


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
    "PayloadInvalid",
    "PayloadTooLarge",
    "PollerError",
    "Published",
    "RawJSON",
    "Settings",
    "UnknownEndpoint",
    "__version__",
    "define_event_type",
    "enqueue",
    "enqueue_async",
    "enqueue_many",
    "enqueue_many_async",
    "load_settings",
    "portal_link",
    "publish",
    "publish_async",
    "publish_many",
    "publish_many_async",
]
