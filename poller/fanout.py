"""Publish once, deliver to every subscriber: the fan-out API.

::

    from poller import publish

    with Session(engine) as session, session.begin():
        session.add(Invoice(id=42, customer="acme", paid=True))
        publish(session, event_type="invoice.paid", payload={"invoice": 42},
                idempotency_key="invoice:42:paid", tenant="acme")
    # committed: every enabled endpoint of tenant "acme" subscribed to
    # "invoice.paid" (or "invoice.*", or "*") has its own delivery

Each endpoint reached gets its own outbox row — its own attempts, retries,
failure and secret — so one endpoint down delays no other. Which endpoints an
event reaches is decided when it is published (poller/subscriptions.py): an
endpoint added or subscribed later receives earlier events only through
``poller admin replay``. Reaching no endpoint is not an error; the event is
kept, with ``fanned_out = 0``, and counted by ``poller admin stats``.

**The event log.** The event is kept once in ``poller_events``; its rows
reference it and hold no copy of the payload, which the claim reads from the
event. A 1,000-endpoint fan-out of a 4 KiB payload writes one payload, not a
thousand (``python -m loadtest.publish`` measures both layouts). An operator
sees an event and all its deliveries with ``poller admin show --event ID``.

**Idempotency.** The idempotency key is unique within the tenant (and among
events without one). Publishing the same key again with the same event type,
payload (as a JSON value) and ordering key returns the first publish's result
(``created=False``) and adds nothing; with other content it raises
:class:`~poller.errors.EventConflict`. Each row carries the event's key, so a
receiver's ``webhook-id`` is the same on every retry. A row that cannot be
added — the key is held by a message ``enqueue`` made for that endpoint, or
spent there by retention — raises, and the publish leaves nothing behind.

**Cost.** An event without an ordering key is one statement: the event, its
rows and the NOTIFY per bucket. ``publish_many``, and any event with an
ordering key (placed behind its key's head per endpoint, poller/ordering.py),
run a few statements inside a savepoint.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Row

from poller import queries
from poller.catalog import check_payload
from poller.errors import (
    EnqueueError,
    EventConflict,
    IdempotencyConflict,
    IdempotencyKeySpent,
    InvalidTenant,
    PayloadInvalid,
)
from poller.insert import (
    AsyncConn,
    DeliverAfter,
    NewRow,
    Steps,
    SyncConn,
    check_schedule,
    drive,
    drive_async,
    insert_rows,
)
from poller.names import check_event_type, check_key, check_ordering_key
from poller.payloads import JsonDefault, serialise_payload
from poller.settings import default_settings
from poller.subscriptions import check_tenant
from poller.tracing import trace_params


@dataclass(frozen=True, slots=True)
class Event:
    """One event for :func:`publish_many`; the fields mean what publish's arguments mean."""

    event_type: str
    payload: Any
    idempotency_key: str
    tenant: str | None = None
    ordering_key: str | None = None
    deliver_after: DeliverAfter = None


@dataclass(frozen=True, slots=True)
class Published:
    """What a publish did: the event's id, and the message id of its delivery to each
    endpoint it reached, by endpoint name. ``created`` is False when the event had
    been published before with this key (nothing was added)."""

    event_id: int
    deliveries: dict[str, int] = field(default_factory=dict)
    created: bool = True


@dataclass(frozen=True, slots=True)
class _CheckedEvent:
    event_type: str
    payload: str  # serialised JSON
    idempotency_key: str
    tenant: str | None
    ordering_key: str | None
    deliver_at: datetime | None
    delay: float

    @property
    def ident(self) -> tuple[str | None, str]:
        return self.tenant, self.idempotency_key


def check_event(event: Event, json_default: JsonDefault | None = None) -> _CheckedEvent:
    """Validate one event completely, writing nothing; raise the specific error."""
    if not isinstance(event, Event):
        raise EnqueueError(f"events must be poller.Event, not {type(event).__name__}")
    deliver_at, delay = check_schedule(event.deliver_after)
    return _CheckedEvent(
        event_type=check_event_type(event.event_type),
        payload=serialise_payload(
            event.payload, default_settings().max_payload_bytes, json_default
        ),
        idempotency_key=check_key(event.idempotency_key),
        tenant=check_tenant(event.tenant, InvalidTenant),
        ordering_key=check_ordering_key(event.ordering_key),
        deliver_at=deliver_at,
        delay=delay,
    )


# --- the steps (sans I/O, driven like enqueue's) --------------------------------


def _publish_one_steps(event: _CheckedEvent) -> Steps:
    """An event without an ordering key: one statement (PUBLISH)."""
    settings = default_settings()
    params = {
        "event_type": event.event_type,
        "payload": event.payload,
        "idempotency_key": event.idempotency_key,
        "tenant": event.tenant,
        "default_max_attempts": settings.max_attempts,
        "deliver_at": event.deliver_at,
        "delay": event.delay,
        "notify": settings.notify,
        **trace_params(),  # kept with the event; its rows read it (poller/tracing.py)
    }
    row = (yield queries.PUBLISH, params)[0]
    if row.event_id is None:
        return (yield from _existing_steps([event]))[0]
    if row.schema is not None:  # the catalog has a schema for its type
        try:
            check_payload(event.event_type, row.schema, event.payload)
        except PayloadInvalid:
            yield queries.UNPUBLISH, {"event_id": row.event_id}
            raise
    if row.skipped:
        reasons = yield (
            queries.PUBLISH_SKIPPED,
            {
                "names": list(row.skipped),
                "idempotency_key": event.idempotency_key,
            },
        )
        yield queries.UNPUBLISH, {"event_id": row.event_id}
        _raise_skipped(reasons, event.idempotency_key)
    return Published(int(row.event_id), {name: int(i) for name, i in row.deliveries})


def _raise_skipped(reasons: Sequence[Row[Any]], key: str) -> None:
    for reason in reasons:
        if reason.existing_id is not None:
            raise IdempotencyConflict(reason.name, key, reason.existing_id)
        raise IdempotencyKeySpent(reason.name, key)
    raise IdempotencyKeySpent("?", key)  # pragma: no cover - an endpoint went meanwhile


def _columns(events: Sequence[_CheckedEvent]) -> dict[str, list[Any]]:
    return {
        "event_types": [e.event_type for e in events],
        "payloads": [e.payload for e in events],
        "idempotency_keys": [e.idempotency_key for e in events],
        "tenants": [e.tenant for e in events],
        "ordering_keys": [e.ordering_key for e in events],
    }


def _existing_steps(events: Sequence[_CheckedEvent]) -> Steps:
    """Events published before: their first publish's result, or EventConflict."""
    rows = {int(r.ord) - 1: r for r in (yield queries.PUBLISH_EXISTING, _columns(events))}
    results = []
    for index, event in enumerate(events):
        row = rows.get(index)
        if row is None:  # purged between the insert and this read
            raise IdempotencyKeySpent("(every endpoint)", event.idempotency_key)
        if not row.same_content:
            raise EventConflict(event.tenant, event.idempotency_key, int(row.id))
        deliveries = {name: int(i) for name, i in row.deliveries}
        results.append(Published(int(row.id), deliveries, created=False))
    return results


def _dedupe(events: Sequence[_CheckedEvent]) -> list[int]:
    """Index of the first occurrence of each (tenant, key); other content raises."""
    first: dict[tuple[str | None, str], int] = {}
    owner = []
    for index, event in enumerate(events):
        seen = first.setdefault(event.ident, index)
        earlier = events[seen]
        if (earlier.event_type, earlier.payload, earlier.ordering_key) != (
            event.event_type,
            event.payload,
            event.ordering_key,
        ):
            raise EventConflict(event.tenant, event.idempotency_key, -1)
        owner.append(seen)
    return owner


def _publish_many_steps(events: Sequence[_CheckedEvent]) -> Steps:
    """Any batch (ordered events included): keep the new events, find their endpoints,
    insert the rows through the kernel every write path shares (poller/insert.py)."""
    owner = _dedupe(events)
    unique = [e for i, e in enumerate(events) if owner[i] == i]
    keys = [e.ordering_key for e in unique if e.ordering_key is not None]
    if keys:  # before the events get their ids, which are their positions
        yield queries.LOCK_KEY_NAMES, {"ordering_keys": keys}
    inserted = yield queries.PUBLISH_EVENTS, {**_columns(unique), **trace_params()}
    new_ids = {(r.tenant, r.idempotency_key): int(r.id) for r in inserted}
    schemas = {(r.tenant, r.idempotency_key): r.schema for r in inserted if r.schema is not None}
    for event in unique:  # against the catalog; a refusal undoes the batch (its savepoint)
        if event.ident in schemas:
            check_payload(event.event_type, schemas[event.ident], event.payload)
    results: dict[tuple[str | None, str], Published] = {}
    old = [e for e in unique if e.ident not in new_ids]
    if old:
        for event, result in zip(old, (yield from _existing_steps(old)), strict=True):
            results[event.ident] = result
    if new_ids:
        by_id = {new_ids[e.ident]: e for e in unique if e.ident in new_ids}
        targets = yield queries.FAN_OUT_TARGETS, {"event_ids": sorted(by_id)}
        rows = [_row(by_id[t.event_id], t) for t in targets]
        ids = (yield from insert_rows(rows, {t.name: t for t in targets})) if rows else []
        deliveries: dict[int, dict[str, int]] = {event_id: {} for event_id in by_id}
        for target, message_id in zip(targets, ids, strict=True):
            deliveries[target.event_id][target.name] = message_id
        for event_id, event in by_id.items():
            results[event.ident] = Published(event_id, deliveries[event_id])
    return [results[events[owner[i]].ident] for i in range(len(events))]


def _row(event: _CheckedEvent, target: Row[Any]) -> NewRow:
    return event_row(
        target.name,
        event.event_type,
        event.idempotency_key,
        event.ordering_key,
        int(target.event_id),
        event.deliver_at,
        event.delay,
    )


def event_row(
    endpoint: str,
    event_type: str,
    idempotency_key: str,
    ordering_key: str | None,
    event_id: int,
    deliver_at: datetime | None = None,
    delay: float = 0.0,
) -> NewRow:
    """A published event's row for one endpoint (for ``insert_rows``): the event's key and
    ordering key, no payload of its own (the claim reads the event's), the endpoint's budget."""
    return NewRow(
        endpoint=endpoint,
        event_type=event_type,
        payload=None,
        idempotency_key=idempotency_key,
        deliver_at=deliver_at,
        delay=delay,
        max_attempts=None,
        ordering_key=ordering_key,
        event_id=event_id,
    )


def _check_all(events: Iterable[Event], json_default: JsonDefault | None) -> list[_CheckedEvent]:
    if isinstance(events, Event | Mapping | str):
        raise EnqueueError("publish_many takes a list of poller.Event")
    return [check_event(event, json_default) for event in events]


# --- public API -------------------------------------------------------------------


def publish(
    conn: SyncConn,
    *,
    event_type: str,
    payload: Any,
    idempotency_key: str,
    tenant: str | None = None,
    ordering_key: str | None = None,
    deliver_after: DeliverAfter = None,
    json_default: JsonDefault | None = None,
) -> Published:
    """Publish one event in the caller's transaction to every enabled endpoint
    subscribed to it (poller/subscriptions.py); return what it reached.

    ``conn``, ``payload``, ``deliver_after``, ``json_default`` and
    ``ordering_key`` (order per endpoint) mean what they mean for
    :func:`~poller.enqueue`. ``tenant``: only that tenant's endpoints; without
    it, only endpoints without a tenant.
    """
    event = check_event(
        Event(event_type, payload, idempotency_key, tenant, ordering_key, deliver_after),
        json_default,
    )
    if event.ordering_key is None:
        return drive(conn, _publish_one_steps(event))  # type: ignore[no-any-return]
    with conn.begin_nested():
        return drive(conn, _publish_many_steps([event]))[0]  # type: ignore[no-any-return]


def publish_many(
    conn: SyncConn, events: Iterable[Event], *, json_default: JsonDefault | None = None
) -> list[Published]:
    """Publish many events at once (a few statements for the batch); results in the
    order given. All are validated before any write; a conflict undoes this call's
    writes (savepoint) and raises."""
    checked = _check_all(events, json_default)
    if not checked:
        return []
    with conn.begin_nested():
        return list(drive(conn, _publish_many_steps(checked)))


async def publish_async(
    conn: AsyncConn,
    *,
    event_type: str,
    payload: Any,
    idempotency_key: str,
    tenant: str | None = None,
    ordering_key: str | None = None,
    deliver_after: DeliverAfter = None,
    json_default: JsonDefault | None = None,
) -> Published:
    """:func:`publish` for an ``AsyncSession`` or ``AsyncConnection``."""
    event = check_event(
        Event(event_type, payload, idempotency_key, tenant, ordering_key, deliver_after),
        json_default,
    )
    if event.ordering_key is None:
        return await drive_async(conn, _publish_one_steps(event))  # type: ignore[no-any-return]
    async with conn.begin_nested():
        return (await drive_async(conn, _publish_many_steps([event])))[0]  # type: ignore[no-any-return]


async def publish_many_async(
    conn: AsyncConn, events: Iterable[Event], *, json_default: JsonDefault | None = None
) -> list[Published]:
    """:func:`publish_many` for an ``AsyncSession`` or ``AsyncConnection``."""
    checked = _check_all(events, json_default)
    if not checked:
        return []
    async with conn.begin_nested():
        return list(await drive_async(conn, _publish_many_steps(checked)))
