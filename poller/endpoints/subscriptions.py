"""What an endpoint receives from :func:`poller.publish`: event types, tenant, payload filter.

An endpoint is **subscribed** to event types by name (``invoice.paid``) or by
pattern: a prefix ending in ``*`` (``invoice.*`` matches ``invoice.paid`` and
``invoice.line.added``, not ``invoice``; ``*`` matches every type). An endpoint
starts with **no subscriptions**: it receives only what is enqueued to it by
name, and published events reach only endpoints that asked for them. (That is
the safe default for an upgrade, too: existing endpoints — an operator's
alert endpoint, say — do not start receiving every event the application
publishes.)

**Tenant.** An event published with ``tenant="acme"`` reaches only endpoints of
tenant ``acme``; an event without a tenant reaches only endpoints without one.
There is no wildcard tenant: a multi-tenant application cannot leak one
customer's events to another's endpoint by forgetting a filter.

**Payload filter.** An optional JSON object the payload must contain, evaluated
by PostgreSQL's ``@>`` (jsonb containment): ``{"region": "eu"}`` matches a
payload with ``"region": "eu"`` among its keys; nested objects match nested
keys; an array matches an array holding those elements. No user code runs.

The matching itself is SQL (:func:`poller.store.queries.publish.reaches`);
:func:`subscribed` is the same rule in Python, for tests and the CLI.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from poller.errors import InvalidSubscription
from poller.rules.health import DEFAULT
from poller.rules.payloads import MAX_DEPTH, loads, nesting

MAX_PATTERNS = 100
MAX_TENANT_LENGTH = 255
MAX_FILTER_BYTES = 4096
_PATTERN_RE = re.compile(r"\*|[A-Za-z0-9][A-Za-z0-9._:/-]*\*?")
_TENANT_RE = re.compile(r"[\x21-\x7e]+")


def check_patterns(events: object) -> list[str]:
    """Event type names and ``prefix*`` patterns: a list (or a comma-separated string),
    de-duplicated in the order given; empty means no subscriptions."""
    if isinstance(events, str):
        events = [part.strip() for part in events.split(",") if part.strip()]
    if not isinstance(events, Iterable) or isinstance(events, Mapping | bytes):
        raise InvalidSubscription("event_types must be a list of event types or patterns")
    patterns: dict[str, None] = {}  # in the order given
    for pattern in events:
        if not isinstance(pattern, str) or len(pattern) > 255 or not _PATTERN_RE.fullmatch(pattern):
            shown = pattern[:80] if isinstance(pattern, str) else type(pattern).__name__
            raise InvalidSubscription(
                f"event type pattern {shown!r} must be an event type (letters, digits and "
                ". _ : / -), a prefix ending in '*' like 'invoice.*', or '*'"
            )
        patterns[pattern] = None
        if len(patterns) > MAX_PATTERNS:  # as soon as it is: a list may be endless
            raise InvalidSubscription(f"at most {MAX_PATTERNS} event type patterns per endpoint")
    return list(patterns)


def check_tenant(tenant: object, error: type[Exception] = InvalidSubscription) -> str | None:
    """None (no tenant), or 1 to 255 visible ASCII characters."""
    if tenant is None:
        return None
    if not isinstance(tenant, str) or not _TENANT_RE.fullmatch(tenant):
        raise error(
            "tenant must be 1 to 255 visible ASCII characters (no spaces), or None for none"
        )
    if len(tenant) > MAX_TENANT_LENGTH:
        raise error(f"tenant is {len(tenant)} characters; at most {MAX_TENANT_LENGTH}")
    return tenant


def check_filter(payload_filter: object) -> dict[str, Any] | None:
    """None, or a JSON object (a dict, or its JSON text) of at most MAX_FILTER_BYTES."""
    if payload_filter is None:
        return None
    if isinstance(payload_filter, str):
        if len(payload_filter.encode("utf-8", "surrogatepass")) > MAX_FILTER_BYTES:
            raise InvalidSubscription(f"payload filter is over {MAX_FILTER_BYTES} bytes")
        try:
            payload_filter = loads(payload_filter)
        except (ValueError, RecursionError) as exc:
            raise InvalidSubscription(f"payload filter is not valid JSON: {exc}") from None
    if not isinstance(payload_filter, dict):
        raise InvalidSubscription('payload filter must be a JSON object, like {"region": "eu"}')
    try:
        text = json.dumps(payload_filter, allow_nan=False, ensure_ascii=False)
        text.encode("utf-8")  # lone surrogates cannot be stored
    except UnicodeEncodeError:
        raise InvalidSubscription(
            "payload filter: a lone surrogate (\\ud800-\\udfff) is not text"
        ) from None
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidSubscription(f"payload filter is not JSON: {exc}") from None
    if "\\u0000" in text or "\x00" in text:
        raise InvalidSubscription("payload filter must not contain NUL characters")
    if len(text.encode("utf-8")) > MAX_FILTER_BYTES:
        raise InvalidSubscription(f"payload filter is over {MAX_FILTER_BYTES} bytes")
    if (depth := nesting(text)) > MAX_DEPTH:  # as deep as a payload may be, no deeper
        raise InvalidSubscription(f"payload filter nests {depth} levels deep; at most {MAX_DEPTH}")
    return dict(json.loads(text))


def check_subscription_settings(
    event_types: Any, tenant: Any, payload_filter: Any
) -> dict[str, Any]:
    """An endpoint's given subscription settings, checked, as columns (None is left out;
    :data:`~poller.rules.health.DEFAULT` clears the tenant or the filter)."""
    checked: dict[str, Any] = {}
    if event_types is not None:
        checked["event_types"] = check_patterns(event_types)
    if tenant is not None:
        checked["tenant"] = None if tenant is DEFAULT else check_tenant(tenant)
    if payload_filter is not None:
        checked["payload_filter"] = (
            None if payload_filter is DEFAULT else check_filter(payload_filter)
        )
    return checked


def subscribed(patterns: Iterable[str], event_type: str) -> bool:
    """Whether these patterns take ``event_type`` (what the SQL does)."""
    return any(
        p == event_type or (p.endswith("*") and event_type.startswith(p[:-1])) for p in patterns
    )
