"""What an idempotency key, an ordering key and an event type may be (pure checks).

Keys travel in HTTP headers (``webhook-id``, ``Idempotency-Key``,
``webhook-ordering-key``) and an idempotency key in a lookup URL's path, so
they are 1 to :data:`MAX_KEY_LENGTH` visible ASCII characters, and an
idempotency key is never ``.`` or ``..``. Enqueue (poller/outbox/enqueue.py), publish
(poller/outbox/publish.py), replay and the operators' filters check with these.
"""

from __future__ import annotations

import re

from poller.errors import EnqueueError, InvalidEventType, InvalidIdempotencyKey, InvalidOrderingKey

MAX_KEY_LENGTH = 255
MAX_EVENT_TYPE_LENGTH = 255
# Idempotency and ordering keys travel in HTTP headers: visible ASCII only.
_KEY_RE = re.compile(r"[\x21-\x7e]+")
# Event types are names like "invoice.paid", "order/created", "billing:v2.charge".
_EVENT_TYPE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]*")


def _header_token(value: object, name: str, header: str, error: type[EnqueueError]) -> str:
    """1 to MAX_KEY_LENGTH visible ASCII characters: the value travels in ``header``."""
    if not isinstance(value, str):
        raise error(f"{name} must be a string, not {type(value).__name__}")
    if not value:
        raise error(f"{name} must not be empty")
    if len(value) > MAX_KEY_LENGTH:
        raise error(f"{name} is {len(value)} characters; at most {MAX_KEY_LENGTH} are allowed")
    if not _KEY_RE.fullmatch(value):
        raise error(
            f"{name} may hold only visible ASCII characters (no spaces or control "
            f"characters): it is sent in the {header} header"
        )
    return value


DOT_SEGMENTS = frozenset({".", ".."})
"""Keys refused: in a lookup URL's path they are dot segments, which URL libraries
resolve — ``…/webhooks/..`` would ask ``…/`` whether the message was processed."""


def check_key(key: object) -> str:
    """An idempotency key: 1 to 255 visible ASCII characters, not a dot segment."""
    checked = _header_token(
        key, "idempotency_key", "webhook-id and Idempotency-Key", InvalidIdempotencyKey
    )
    if checked in DOT_SEGMENTS:
        raise InvalidIdempotencyKey(
            f"idempotency_key {checked!r} is a path's dot segment: a lookup URL holding it "
            "would name another resource"
        )
    return checked


def check_ordering_key(key: object) -> str | None:
    """None (no order), or a key like an idempotency key (poller/rows/ordering.py)."""
    if key is None:
        return None
    return _header_token(key, "ordering_key", "webhook-ordering-key", InvalidOrderingKey)


def could_be_event_type(text: str) -> bool:
    """Whether any message or event can have this type (a filter for one that cannot
    matches nothing; PostgreSQL would refuse one with a NUL outright)."""
    return len(text) <= MAX_EVENT_TYPE_LENGTH and _EVENT_TYPE_RE.fullmatch(text) is not None


def check_event_type(event_type: object) -> str:
    """An event type: a name like ``invoice.paid``, ``order/created``, ``billing:v2.charge``."""
    if not isinstance(event_type, str) or not event_type.strip():
        raise InvalidEventType("event_type must be a non-empty string")
    if len(event_type) > MAX_EVENT_TYPE_LENGTH:
        raise InvalidEventType(f"event_type is over {MAX_EVENT_TYPE_LENGTH} characters")
    if not _EVENT_TYPE_RE.fullmatch(event_type):
        raise InvalidEventType(
            f"event_type {event_type[:80]!r} must be letters, digits and . _ : / - "
            "(starting with a letter or digit), e.g. 'invoice.paid'"
        )
    return event_type
