"""What ``poller endpoints`` shows of an endpoint: its public fields (never a secret, a
header value or a key) and how each reads in a table."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from poller.cli.output import age, iso

if TYPE_CHECKING:
    from poller.endpoints.registry import Endpoint


def public(endpoint: Endpoint) -> dict[str, Any]:
    """Everything but the secrets (poller/endpoints/view.py)."""
    from poller.endpoints.view import public as shown

    return shown(endpoint)


def shown_field(name: str, value: Any) -> Any:
    if name == "headers":
        return ", ".join(value) or "none"
    if name == "retry_schedule":
        return ", ".join(f"{s:g}s" for s in value) if value else "default"
    if name == "tls":
        return _shown_tls(value)
    if name == "paused":
        if value is None:
            return "no"
        until = iso(value["until"]) if value["until"] else "'poller endpoints resume'"
        return f"paused until {until} (by {value['by']})"
    if name == "max_age":
        return "none" if value is None else f"{value:g}s"
    return _shown(value)


def _shown_tls(value: dict[str, Any] | None) -> str:
    if value is None:
        return "system CAs, no client certificate"
    cert, bundle = value["client_cert"], value["ca_bundle"]
    parts = [
        f"client certificate {cert['subject']} (by {cert['issuer']}, expires "
        f"{iso(cert['expires'])})"
        if cert
        else "no client certificate",
        f"trusts only {', '.join(bundle)}" if bundle else "system CAs",
    ]
    return "; ".join(parts)


def _shown(value: Any) -> Any:
    if hasattr(value, "isoformat"):
        return iso(value)
    if isinstance(value, list):
        return ", ".join(value) or "none (only enqueue reaches it)"
    if isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False)
    return value


def state(r: dict[str, Any]) -> str:
    if not r["enabled"]:
        return f"disabled: {r['disabled_reason']}"
    if r["paused_by_operator"] is not None:
        until = r["paused_by_operator"]["until"]
        return f"paused by {r['paused_by_operator']['by']} " + (
            f"until {iso(until)}" if until else "until resumed"
        )
    if r["circuit"] == "open":
        return f"circuit open since {age(r['opened_at'])}, probe {age(r['next_probe_at'])}"
    if r["circuit"] == "half_open":
        return f"circuit half-open (probe sent {age(r['probe_sent_at'])})"
    if r["paused_until"] is not None:
        return f"paused (Retry-After) until {age(r['paused_until'])}"
    return "ok"


def percent(ratio: float | None, sends: int) -> str:
    return "-" if ratio is None else f"{ratio:.1%} of {sends}"


def rate(r: dict[str, Any]) -> str:
    if r["rate_limit"] is None:
        return "unlimited"
    return f"{r['rate_limit']:g}/s, burst {r['rate_burst']}, {r['rate_in_use']:.0%} in use"
