"""Operator queries and actions behind ``poller admin`` (sync, SQLAlchemy Core).

What failed and why (:func:`list_failed`, :func:`message_detail`), how the
queue is doing (:func:`queue_stats`), sending again (:func:`retry_messages`)
and deleting history (:func:`purge`). Every action is one short transaction
per batch, so a large retry or purge never holds long locks; every manual
retry is recorded as an attempt of kind ``manual`` naming who asked.
"""

from __future__ import annotations

import getpass
import socket
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, and_, func, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert

from poller.errors import PollerError, UnknownEndpoint
from poller.ordering import requeue_keyed
from poller.schema import STATUSES, delivery_attempts, endpoints, event_log, outbox
from poller.schema import endpoint_health as health_table
from poller.settings import default_settings

PURGE_BATCH = 1000


class MessageNotFound(PollerError, LookupError):
    """No message has this id (or key on this endpoint)."""


def actor() -> str:
    """Who is acting, for the attempt record: user@host."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"admin:{user}@{socket.gethostname()}"


def _endpoint_id(conn: Connection, name: str) -> int:
    found = conn.execute(select(endpoints.c.id).where(endpoints.c.name == name)).scalar()
    if found is None:
        raise UnknownEndpoint(name)
    return int(found)


# --- reading ---------------------------------------------------------------------


def queue_stats(conn: Connection) -> dict[str, Any]:
    """Counts by status and endpoint, lag, in flight, recent failures and attempt rate."""
    by = conn.execute(
        select(endpoints.c.name, outbox.c.status, func.count())
        .join(endpoints, endpoints.c.id == outbox.c.endpoint_id)
        .group_by(endpoints.c.name, outbox.c.status)
    ).all()
    per_endpoint: dict[str, dict[str, int]] = {}
    totals: dict[str, int] = {s: 0 for s in STATUSES}  # waiting: behind an ordering key's head
    for name, status, count in by:
        per_endpoint.setdefault(name, {s: 0 for s in totals})[status] = count
        totals[status] += count
    now = func.now()
    oldest_due = conn.execute(
        select(func.extract("epoch", now - func.min(outbox.c.next_attempt_at))).where(
            outbox.c.status == "pending", outbox.c.next_attempt_at <= now
        )
    ).scalar()
    failed_hour, failed_day = conn.execute(
        select(
            func.count().filter(outbox.c.failed_at > now - timedelta(hours=1)),
            func.count().filter(outbox.c.failed_at > now - timedelta(days=1)),
        ).where(outbox.c.status == "failed")
    ).one()
    recent = conn.execute(
        select(func.count()).where(delivery_attempts.c.finished_at > now - timedelta(minutes=1))
    ).scalar_one()
    published_day, unrouted_day = conn.execute(
        select(func.count(), func.count().filter(event_log.c.fanned_out == 0)).where(
            event_log.c.created_at > now - timedelta(days=1)
        )
    ).one()
    states = {
        row.name: _endpoint_state(row)
        for row in conn.execute(
            select(
                endpoints.c.name,
                endpoints.c.enabled,
                endpoints.c.paused_until,
                health_table.c.state,
            ).join(health_table, health_table.c.endpoint_id == endpoints.c.id, isouter=True)
        )
    }
    held = sum(
        counts["pending"] for name, counts in per_endpoint.items() if states.get(name, "ok") != "ok"
    )
    return {
        "totals": totals,
        "endpoints": per_endpoint,
        # Why an endpoint's pending messages may be waiting: ok, disabled, circuit open,
        # circuit half-open, paused (Retry-After). ``held``: pending behind such endpoints.
        "endpoint_states": {name: states.get(name, "ok") for name in per_endpoint},
        "pending_held": held,
        "oldest_due_pending_seconds": float(oldest_due) if oldest_due is not None else None,
        "in_flight": totals["in_flight"],
        "failed_last_hour": failed_hour,
        "failed_last_day": failed_day,
        # Published events (poller/publish.py), and those that reached no endpoint.
        "events_last_day": published_day,
        "events_unrouted_last_day": unrouted_day,
        "attempts_per_second_last_minute": recent / 60,
    }


def _endpoint_state(row: Any) -> str:
    if not row.enabled:
        return "disabled"
    if row.state in ("open", "half_open"):
        return "circuit " + str(row.state).replace("_", "-")
    if row.paused_until is not None and row.paused_until > datetime.now(UTC):
        return "paused"
    return "ok"


def list_failed(
    conn: Connection,
    *,
    endpoint: str | None = None,
    event_type: str | None = None,
    since: datetime | None = None,
    limit: int = 50,
) -> list[dict[str, Any]]:
    """Failed messages, newest failure first."""
    query = (
        select(
            outbox.c.id,
            endpoints.c.name.label("endpoint"),
            outbox.c.event_type,
            outbox.c.idempotency_key,
            outbox.c.attempts,
            outbox.c.max_attempts,
            outbox.c.last_status_code,
            outbox.c.last_error,
            outbox.c.failed_at,
        )
        .join(endpoints, endpoints.c.id == outbox.c.endpoint_id)
        .where(outbox.c.status == "failed")
        .order_by(outbox.c.failed_at.desc(), outbox.c.id.desc())
        .limit(limit)
    )
    if endpoint is not None:
        query = query.where(outbox.c.endpoint_id == _endpoint_id(conn, endpoint))
    if event_type is not None:
        query = query.where(outbox.c.event_type == event_type)
    if since is not None:
        query = query.where(outbox.c.failed_at >= since)
    return [dict(row._mapping) for row in conn.execute(query)]


def message_detail(
    conn: Connection,
    message_id: int | None = None,
    *,
    key: str | None = None,
    endpoint: str | None = None,
) -> dict[str, Any]:
    """The message (payload included) and every attempt, oldest first."""
    query = select(outbox, endpoints.c.name.label("endpoint")).join(
        endpoints, endpoints.c.id == outbox.c.endpoint_id
    )
    if message_id is not None:
        query = query.where(outbox.c.id == message_id)
    elif key is not None and endpoint is not None:
        query = query.where(
            outbox.c.endpoint_id == _endpoint_id(conn, endpoint), outbox.c.idempotency_key == key
        )
    else:
        raise MessageNotFound("give a message id, or --key with --endpoint")
    row = conn.execute(query).one_or_none()
    if row is None:
        ident = message_id if message_id is not None else f"{key!r} on {endpoint!r}"
        raise MessageNotFound(f"no message {ident}")
    attempts = conn.execute(
        select(delivery_attempts)
        .where(delivery_attempts.c.message_id == row.id)
        .order_by(delivery_attempts.c.id)
    ).all()
    detail = dict(row._mapping)
    detail.pop("endpoint_id")
    if detail["payload"] is None and row.event_id is not None:  # a published event's row
        detail["payload"] = conn.execute(
            select(event_log.c.payload).where(event_log.c.id == row.event_id)
        ).scalar()
    detail["attempts_log"] = [dict(a._mapping) for a in attempts]
    return detail


def endpoint_health(conn: Connection, endpoint_id: int) -> dict[str, Any]:
    """Last success, failures since then, and the endpoint's queue by status."""
    last_success = conn.execute(
        select(func.max(outbox.c.delivered_at)).where(outbox.c.endpoint_id == endpoint_id)
    ).scalar()
    since = (
        select(delivery_attempts.c.id)
        .join(outbox, outbox.c.id == delivery_attempts.c.message_id)
        .where(outbox.c.endpoint_id == endpoint_id, delivery_attempts.c.kind == "send")
    )
    if last_success is not None:
        since = since.where(delivery_attempts.c.finished_at > last_success)
    failures = conn.execute(
        select(func.count()).select_from(
            since.where(delivery_attempts.c.outcome != "delivered").subquery()
        )
    ).scalar_one()
    queue: dict[str, int] = dict(
        conn.execute(
            select(outbox.c.status, func.count())
            .where(outbox.c.endpoint_id == endpoint_id)
            .group_by(outbox.c.status)
        ).all()
    )
    return {
        "last_success": last_success,
        "failures_since_last_success": failures,
        "messages": queue,
    }


def health_report(conn: Connection, name: str | None = None) -> list[dict[str, Any]]:
    """Each endpoint's health (poller/health.py), or ``name``'s: circuit, failure streak,
    last success, send success ratio over 1 h and 24 h, rate limit and its use now."""
    from poller import queries

    rows = conn.execute(queries.HEALTH_REPORT, {"name": name}).all()
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


# --- acting ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RetryPlan:
    ids: list[int]
    skipped: dict[int, str]  # id -> why it was left alone


def plan_retry(
    conn: Connection,
    ids: list[int] | None = None,
    *,
    all_failed: bool = False,
    endpoint: str | None = None,
    since: datetime | None = None,
    force: bool = False,
) -> RetryPlan:
    """Which messages a retry would send again: failed ones (delivered with ``force``)."""
    query = select(outbox.c.id, outbox.c.status)
    if ids:
        query = query.where(outbox.c.id.in_(ids))
    elif all_failed:
        query = query.where(outbox.c.status == "failed")
        if endpoint is not None:
            query = query.where(outbox.c.endpoint_id == _endpoint_id(conn, endpoint))
        if since is not None:
            query = query.where(outbox.c.failed_at >= since)
    else:
        return RetryPlan([], {})
    rows = dict(conn.execute(query.order_by(outbox.c.id)).all())
    allowed = {"failed", "delivered"} if force else {"failed"}
    skipped = {
        i: f"is {s}"
        + (
            ""
            if s == "delivered" and force
            else " (only failed messages; delivered ones with --force)"
            if s == "delivered"
            else ""
        )
        for i, s in rows.items()
        if s not in allowed
    }
    for missing in set(ids or ()) - set(rows):
        skipped[missing] = "not found"
    return RetryPlan([i for i, s in rows.items() if s in allowed], skipped)


def retry_messages(
    engine: Engine, ids: list[int], *, who: str | None = None, outcome: str = "manual_retry"
) -> int:
    """Back to pending now with a fresh attempt budget; a ``manual`` attempt records who
    (and ``outcome``: ``manual_retry``, or ``replayed`` for poller/replay.py)."""
    who = who or actor()
    default = default_settings().max_attempts
    done = 0
    for start in range(0, len(ids), PURGE_BATCH):
        chunk = ids[start : start + PURGE_BATCH]
        with engine.begin() as conn:
            budget = func.coalesce(
                select(endpoints.c.max_attempts)
                .where(endpoints.c.id == outbox.c.endpoint_id)
                .scalar_subquery(),
                default,
            )
            changed = conn.execute(
                update(outbox)
                .where(outbox.c.id.in_(chunk), outbox.c.status.in_(("failed", "delivered")))
                .values(
                    status="pending",
                    next_attempt_at=func.now(),
                    needs_lookup=False,
                    max_attempts=outbox.c.attempts + budget,
                    failed_at=None,
                    delivered_at=None,
                    claim_expires_at=None,
                    updated_at=func.now(),
                )
                .returning(
                    outbox.c.id,
                    outbox.c.attempts,
                    outbox.c.bucket,
                    outbox.c.endpoint_id,
                    outbox.c.ordering_key,
                )
            ).all()
            requeue_keyed(
                conn,
                [(r.id, r.endpoint_id, r.ordering_key) for r in changed if r.ordering_key],
            )
            if changed:
                conn.execute(
                    pg_insert(delivery_attempts),
                    [
                        {
                            "message_id": r.id,
                            "attempt": r.attempts,
                            "kind": "manual",
                            "poller_id": who,
                            "outcome": outcome,
                        }
                        for r in changed
                    ],
                )
                for bucket in {r.bucket for r in changed}:
                    conn.execute(select(func.pg_notify("poller_outbox", str(bucket))))
            done += len(changed)
    return done


def purge_counts(
    conn: Connection, delivered_older: timedelta | None, failed_older: timedelta | None
) -> dict[str, int]:
    """How many rows a purge would delete."""
    counts = {}
    for status, column, older in (
        ("delivered", outbox.c.delivered_at, delivered_older),
        ("failed", outbox.c.failed_at, failed_older),
    ):
        if older is not None:
            counts[status] = conn.execute(
                select(func.count()).where(
                    and_(outbox.c.status == status, column < func.now() - older)
                )
            ).scalar_one()
    return counts


def purge(
    engine: Engine, delivered_older: timedelta | None, failed_older: timedelta | None
) -> dict[str, int]:
    """Delete old delivered/failed rows (and their attempts) in batches of PURGE_BATCH."""
    from poller import queries

    deleted: dict[str, int] = {}
    for status, statement, older in (
        ("delivered", queries.PURGE_DELIVERED, delivered_older),
        ("failed", queries.PURGE_FAILED, failed_older),
    ):
        if older is None:
            continue
        deleted[status] = 0
        while True:
            with engine.begin() as conn:
                params = {"age": older.total_seconds(), "limit": PURGE_BATCH}
                n = int(conn.execute(statement, params).scalar_one())
            deleted[status] += n
            if n < PURGE_BATCH:
                break
    return deleted
