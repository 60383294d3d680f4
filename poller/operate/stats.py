"""How the queue and the endpoints are doing: the reads behind ``poller admin stats``,
``poller endpoints health`` and the dashboard's overview and endpoints pages.

Each is built to cost the same with a million rows of history as with none:
open rows are counted from their partial indexes, attempts are found through the
BRIN index on ``finished_at`` (poller/store/schema.py).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection

from poller.endpoints.checks import could_be_name
from poller.errors import InvalidInput, UnknownEndpoint
from poller.store import queries
from poller.store.queries import reports as built
from poller.store.schema import STATUSES

EXACT_BELOW = 200_000
"""``queue_stats(delivered=False)`` still counts delivered rows exactly below this many rows."""


def queue_stats(conn: Connection, *, delivered: bool = True) -> dict[str, Any]:
    """Counts by status and endpoint, lag, in flight, recent failures and attempt rate.

    ``delivered=False`` (the dashboard's overview): on a table of more than
    :data:`EXACT_BELOW` rows, delivered rows are not counted per endpoint but
    estimated in total from the planner's row count (``delivered_estimated``), so
    the answer costs the same with a million rows of history as with none."""
    rows = list(conn.execute(queries.OPEN_COUNTS))
    estimated = False
    if not delivered:
        total = conn.execute(queries.OUTBOX_ROWS_ESTIMATE).scalar()
        estimated = total is not None and total >= EXACT_BELOW
    if not estimated:
        rows += conn.execute(queries.DELIVERED_COUNTS).all()
    # the endpoints counted, not every one: a product's customers' thousands are mostly idle
    counted = conn.execute(built.endpoint_states(endpoint_id for endpoint_id, _, _ in rows)).all()
    names = {row.id: row.name for row in counted}
    states = {row.name: _endpoint_state(row) for row in counted}
    per_endpoint: dict[str, dict[str, int]] = {}
    totals: dict[str, int] = {s: 0 for s in STATUSES}  # waiting: behind an ordering key's head
    for endpoint_id, status, count in rows:
        name = names.get(endpoint_id, f"#{endpoint_id}")
        per_endpoint.setdefault(name, {s: 0 for s in totals})[status] = count
        totals[status] += count
    if estimated:
        totals["delivered"] = max(int(total or 0) - sum(totals.values()), 0)
    oldest_due = conn.execute(built.OLDEST_DUE).scalar()
    failed_hour, failed_day = conn.execute(built.FAILED_RECENTLY).one()
    recent = conn.execute(built.ATTEMPTS_LAST_MINUTE).scalar_one()
    published_day, unrouted_day = conn.execute(built.EVENTS_LAST_DAY).one()
    held = sum(
        counts["pending"] for name, counts in per_endpoint.items() if states.get(name, "ok") != "ok"
    )
    return {
        "totals": totals,
        "endpoints": per_endpoint,
        # Why an endpoint's pending messages may be waiting: ok, disabled, paused by
        # operator (poller/operate/cancel.py), circuit open, circuit half-open, paused
        # (Retry-After). ``held``: pending behind such endpoints.
        "endpoint_states": {name: states.get(name, "ok") for name in per_endpoint},
        "pending_held": held,
        "oldest_due_pending_seconds": float(oldest_due) if oldest_due is not None else None,
        "in_flight": totals["in_flight"],
        "failed_last_hour": failed_hour,
        "failed_last_day": failed_day,
        # Published events (poller/outbox/publish.py), and those that reached no endpoint.
        "events_last_day": published_day,
        "events_unrouted_last_day": unrouted_day,
        "attempts_per_second_last_minute": recent / 60,
        "delivered_estimated": estimated,  # totals' delivered is the planner's estimate
    }


def _held(row: Any) -> bool:
    """Whether an operator's pause holds the endpoint (of a row with held_by, held_until)."""
    return row.held_by is not None and (
        row.held_until is None or row.held_until > datetime.now(UTC)
    )


def _endpoint_state(row: Any) -> str:
    if not row.enabled:
        return "disabled"
    if _held(row):
        return "paused by operator"
    if row.state in ("open", "half_open"):
        return "circuit " + str(row.state).replace("_", "-")
    if row.paused_until is not None and row.paused_until > datetime.now(UTC):
        return "paused"
    return "ok"


def activity(conn: Connection, minutes: int = 60) -> list[dict[str, Any]]:
    """Attempts per minute over the last ``minutes`` (delivered, and not), oldest first,
    minutes without any included as zeros. The BRIN index on finished_at finds them."""
    rows = conn.execute(queries.ACTIVITY, {"n": minutes}).all()
    now = conn.execute(queries.THIS_MINUTE).scalar_one()
    found = {r.minute: r for r in rows}
    series = []
    for back in range(minutes - 1, -1, -1):
        minute = now - timedelta(minutes=back)
        row = found.get(minute)
        series.append(
            {
                "minute": minute,
                "delivered": row.delivered if row else 0,
                "failed": row.failed if row else 0,
            }
        )
    return series


def endpoint_health(conn: Connection, endpoint_id: int) -> dict[str, Any]:
    """Last success, failures since then, and the endpoint's queue by status."""
    last_success = conn.execute(built.last_success(endpoint_id)).scalar()
    failures = conn.execute(built.failures_since(endpoint_id, last_success)).scalar_one()
    queue: dict[str, int] = dict(conn.execute(built.endpoint_queue(endpoint_id)).all())
    return {
        "last_success": last_success,
        "failures_since_last_success": failures,
        "messages": queue,
    }


def health_report(
    conn: Connection,
    name: str | None = None,
    *,
    after: str | None = None,
    contains: str | None = None,
    limit: int | None = None,
) -> list[dict[str, Any]]:
    """Each endpoint's health (poller/rules/health.py), or ``name``'s: circuit, failure streak,
    last success, send success ratio over 1 h and 24 h, rate limit and its use now.
    By name; a page of at most ``limit`` after the name ``after``, of the endpoints
    whose names contain ``contains``."""
    if name is not None and not could_be_name(name):  # a NUL would reach PostgreSQL
        raise UnknownEndpoint(name)
    for value in (after, contains):
        if value is not None and "\x00" in value:
            raise InvalidInput("an endpoint name has no NUL character")
    params = {"name": name, "after": after, "contains": contains or None, "limit": limit}
    rows = conn.execute(queries.HEALTH_REPORT, params).all()
    if name is not None and not rows:
        raise UnknownEndpoint(name)
    report = []
    for r in rows:
        paused = r.paused_until if r.state == "closed" else None
        if paused is not None and paused <= datetime.now(UTC):
            paused = None
        report.append(
            {
                "name": r.name,
                "enabled": r.enabled,
                "disabled_reason": r.disabled_reason,
                "circuit": r.state,
                "consecutive_failures": r.consecutive_failures,
                "circuit_failures": r.circuit_failures,
                "circuit_cooldown": r.circuit_cooldown,
                "opened_at": r.opened_at,
                "next_probe_at": r.open_until if r.state == "open" else None,
                "probe_sent_at": r.probe_at if r.state == "half_open" else None,
                "cooldown": r.cooldown,
                "opens": r.opens,
                "probes": r.probes,
                "last_success_at": r.last_success_at,
                "last_failure_at": r.last_failure_at,
                "failing_since": r.failing_since,
                "last_error": r.last_error,
                "paused_until": paused,
                # an operator's pause (poller/operate/cancel.py): by whom, until when (None: resume)
                "paused_by_operator": {"by": r.held_by, "until": r.held_until}
                if _held(r)
                else None,
                "success_ratio_1h": _ratio(r.ok_1h, r.sends_1h),
                "sends_1h": r.sends_1h,
                "success_ratio_24h": _ratio(r.ok_24h, r.sends_24h),
                "sends_24h": r.sends_24h,
                "rate_limit": r.rate_limit,
                "rate_burst": r.rate_burst if r.rate_limit is not None else None,
                "rate_tokens": None if r.tokens is None else round(max(r.tokens, 0.0), 2),
                "rate_in_use": None
                if r.tokens is None
                else round(1 - max(r.tokens, 0.0) / r.rate_burst, 3),
                "pending": r.pending,
            }
        )
    return report


def _ratio(ok: int, total: int) -> float | None:
    return None if not total else round(ok / total, 4)
