"""Published events for operators: one event with its deliveries (``poller admin show
--event``), and replay — deliver past events to one endpoint again (``poller admin replay``).

For a new endpoint catching up, or a receiver that lost data. The events are
those kept in ``poller_events`` (``POLLER_RETENTION_EVENTS``) and published in
the window asked for, that the endpoint is subscribed to *now* (event types,
tenant, payload filter: poller/endpoints/subscriptions.py), optionally of one type.
For each one:

* the endpoint has no delivery of it: a new one is queued (an ordered event
  behind its key's head), even if retention had spent the key there;
* its delivery ended (delivered or failed): it is sent again with a fresh
  attempt budget, recorded as a ``manual`` attempt with outcome ``replayed``;
* its delivery is still open (pending, waiting, in flight): it is left alone;
* the key is held by a message ``enqueue`` made for the endpoint: left alone,
  and counted as ``taken``.

Every delivery keeps the event's idempotency key, so a receiver that did
apply an event before sees the same ``webhook-id`` and can ignore it.

The work goes in batches of events (``batch``, default 500), each its own
short transaction read through the events' time index, so replaying a million
events never holds long locks and pollers deliver while it runs. ``dry_run``
reads the same batches and writes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, Engine

from poller.endpoints.checks import could_be_name
from poller.errors import (
    EndpointDisabled,
    EventNotFound,
    InvalidEventType,
    InvalidReplay,
    UnknownEndpoint,
)
from poller.operate.admin import actor, retry_messages
from poller.rules.names import could_be_event_type
from poller.rules.parse import could_be_row_id
from poller.rules.payloads import stored_payload
from poller.settings import default_settings
from poller.store import queries
from poller.store.queries import admin as built

REPLAY_BATCH = 500
OPEN = frozenset({"pending", "waiting", "in_flight"})


def event_detail(conn: Connection, event_id: int) -> dict[str, Any]:
    """The event (payload included) and each of its deliveries, by endpoint name."""
    row = conn.execute(built.event(event_id)).one_or_none() if could_be_row_id(event_id) else None
    if row is None:
        raise EventNotFound(f"no event {event_id}")
    detail = dict(row._mapping)
    detail["payload"] = stored_payload(detail["payload"])
    deliveries = conn.execute(queries.EVENT_DELIVERIES, {"event_id": event_id})
    detail["deliveries"] = [dict(d._mapping) for d in deliveries]
    return detail


@dataclass
class ReplayResult:
    """What a replay found and did (or, dry, would do)."""

    events: int = 0  # events in the window the endpoint is subscribed to
    queued: int = 0  # new deliveries
    resent: int = 0  # ended deliveries sent again
    open: int = 0  # deliveries still open, left alone
    taken: int = 0  # keys held by an enqueued message, left alone
    batches: int = 0
    dry_run: bool = False
    message_ids: list[int] = field(default_factory=list, repr=False)

    def as_dict(self) -> dict[str, Any]:
        return {
            "events": self.events,
            "queued": self.queued,
            "resent": self.resent,
            "open": self.open,
            "taken": self.taken,
            "batches": self.batches,
            "dry_run": self.dry_run,
        }


def _check(since: datetime, until: datetime | None, event_type: str | None, batch: int) -> None:
    if since.tzinfo is None or (until is not None and until.tzinfo is None):
        raise InvalidReplay("since and until must be timezone-aware")
    if batch < 1:
        raise InvalidReplay("batch must be at least 1")
    if event_type is not None and not could_be_event_type(event_type):
        raise InvalidEventType(f"event type {event_type[:80]!r}: no event can have it")


def _insert(conn: Connection, target: Any, events: Sequence[Any]) -> list[int]:
    """The endpoint's rows for these events, through the kernel every write shares (the
    database's poller_insert_rows): placed behind their keys' heads, the endpoint's
    budget, no payload of their own (the claim reads the event's)."""
    settings = default_settings()
    params = {
        "endpoint_ids": [target.id] * len(events),
        "event_types": [r.event_type for r in events],
        "payloads": [None] * len(events),
        "idempotency_keys": [r.idempotency_key for r in events],
        "max_attempts": [target.max_attempts or settings.max_attempts] * len(events),
        "deliver_ats": [None] * len(events),
        "delays": [0.0] * len(events),
        "ordering_keys": [r.ordering_key for r in events],
        "event_ids": [int(r.id) for r in events],
        "traceparent": None,
        "tracestate": None,
        "notify": settings.notify,
    }
    return [int(i) for i in conn.execute(queries.INSERT_ROWS_CALL, params).scalar_one()]


def replay(
    engine: Engine,
    endpoint: str,
    *,
    since: datetime,
    until: datetime | None = None,
    event_type: str | None = None,
    dry_run: bool = False,
    batch: int = REPLAY_BATCH,
    who: str | None = None,
    event_id: int | None = None,
) -> ReplayResult:
    """Deliver the events published in [since, until) to ``endpoint`` again (see above);
    ``event_id``: only that one."""
    _check(since, until, event_type, batch)
    until = until or datetime.now(UTC)
    if not could_be_name(endpoint):
        raise UnknownEndpoint(endpoint)
    with engine.connect() as conn:
        found = conn.execute(queries.ENDPOINTS_BY_NAME, {"names": [endpoint]}).all()
    if not found:
        raise UnknownEndpoint(endpoint)
    target = found[0]
    if not target.enabled and not dry_run:
        raise EndpointDisabled(endpoint, target.disabled_reason)
    result = ReplayResult(dry_run=dry_run)
    if event_id is not None and not could_be_row_id(event_id):
        return result  # no event has it
    cursor: tuple[datetime, int] = (since, 0)
    params = {"endpoint_id": target.id, "until": until, "event_type": event_type,
              "event_id": event_id, "limit": batch}  # fmt: skip
    while True:
        with engine.begin() as conn:
            rows = conn.execute(
                queries.REPLAY_BATCH, {**params, "after_at": cursor[0], "after_id": cursor[1]}
            ).all()
            if not rows:
                break
            cursor = (rows[-1].created_at, int(rows[-1].id))
            result.batches += 1
            result.events += len(rows)
            new = [r for r in rows if r.message_id is None]
            ended = [
                int(r.message_id)
                for r in rows
                if r.message_id is not None and r.message_event_id == r.id and r.status not in OPEN
            ]
            result.open += sum(1 for r in rows if r.message_event_id == r.id and r.status in OPEN)
            result.taken += sum(
                1 for r in rows if r.message_id is not None and r.message_event_id != r.id
            )
            result.queued += len(new)
            result.resent += len(ended)
            if new and not dry_run:
                conn.execute(
                    queries.UNSPEND_KEYS,
                    {"endpoint_id": target.id, "keys": [r.idempotency_key for r in new]},
                ).all()
                result.message_ids += _insert(conn, target, new)
        if ended and not dry_run:
            retry_messages(engine, ended, who=who or actor(), outcome="replayed")
            result.message_ids += ended
        if len(rows) < batch:
            break
    return result
