"""What every face shows of an endpoint (the CLI's ``--json``, the dashboard, the API): its
public fields, never a secret, a header's value or a key."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from poller.rules import actors

if TYPE_CHECKING:
    from poller.endpoints.registry import Endpoint


def seen_by(endpoint: Endpoint, tenant: str | None) -> Endpoint:
    """``endpoint`` as a tenant's views show it (the API with a tenant's token, the
    portal): an operator's identity in its disabled reason or pause is ``operator``
    (poller/rules/actors.py); ``tenant`` None, an operator's view, sees it all."""
    if tenant is None or not (endpoint.disabled_reason or endpoint.held_by):
        return endpoint
    return dataclasses.replace(
        endpoint,
        disabled_reason=actors.seen_by(endpoint.disabled_reason, tenant),
        held_by=actors.seen_by(endpoint.held_by, tenant),
    )


def public(endpoint: Endpoint) -> dict[str, Any]:
    """Everything but the secrets: what the CLI's --json, the dashboard and the API
    show of an endpoint (never a secret, a header value or a key)."""
    return {
        "name": endpoint.name,
        "url": endpoint.url,
        "lookup_url": endpoint.lookup_url,
        "enabled": endpoint.enabled,
        "disabled_reason": endpoint.disabled_reason,
        "max_attempts": endpoint.max_attempts,
        "timeout": endpoint.timeout,
        "max_in_flight": endpoint.max_in_flight,
        "bucket": endpoint.bucket,
        "on_failed_head": endpoint.on_failed_head,
        "rate_limit": endpoint.rate_limit,
        "rate_burst": endpoint.rate_burst,
        "circuit_failures": endpoint.circuit_failures,
        "circuit_cooldown": endpoint.circuit_cooldown,
        "event_types": list(endpoint.event_types),
        "tenant": endpoint.tenant,
        "payload_filter": endpoint.payload_filter,
        "created_at": endpoint.created_at,
        "previous_secret_expires_at": endpoint.previous_secret_expires_at,
        "secret_encrypted": endpoint.secret_sealed,
        "signing": endpoint.signing,
        "public_keys": list(endpoint.public_keys),  # ed25519: what the receiver verifies with
        "headers": list(endpoint.header_names),  # names only: the values are credentials
        "retry_schedule": list(endpoint.retry_schedule) if endpoint.retry_schedule else None,
        "max_age": endpoint.max_age,
        "trace_context": endpoint.trace_context,
        # An operator's pause (poller/operate/cancel.py): until when (None: until resumed), by whom.
        "tls": endpoint.tls.summary() if endpoint.tls else None,  # subjects, never the key
        "paused": {"until": endpoint.held_until, "by": endpoint.held_by}
        if endpoint.paused
        else None,
    }
