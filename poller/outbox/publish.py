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
event reaches is decided when it is published (poller/endpoints/subscriptions.py): an
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
ordering key (placed behind its key's head per endpoint, poller/rows/ordering.py),
run a few statements inside a savepoint.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from poller.endpoints.subscriptions import check_tenant
from poller.errors import EnqueueError, InvalidTenant, PayloadInvalid, from_sqlstate
from poller.outbox.catalog import check_payload
from poller.outbox.doors import AsyncDoor, Door, Steps
from poller.outbox.insert import DeliverAfter, NewRow, check_schedule
from poller.rules.names import check_event_type, check_key, check_ordering_key
from poller.rules.payloads import JsonDefault, serialise_payload
from poller.rules.tracing import trace_params
from poller.settings import default_settings
from poller.store import queries


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


def _settings_params() -> dict[str, Any]:
    settings = default_settings()
    return {
        "max_payload_bytes": settings.max_payload_bytes,
        "default_max_attempts": settings.max_attempts,
        "notify": settings.notify,
        **trace_params(),  # kept with the event; its rows read it (poller/rules/tracing.py)
    }


def _deliveries(text: str | None) -> dict[str, int]:
    return {name: int(i) for name, i in json.loads(text or "[]")}


def _publish_one_steps(event: _CheckedEvent) -> Steps:
    """An event without an ordering key: poller_try_publish (one statement), then its
    payload checked against its type's JSON Schema if the catalog has one — undone if it
    does not hold, marked checked if it does."""
    params = {
        "event_type": event.event_type,
        "payload": event.payload,
        "idempotency_key": event.idempotency_key,
        "tenant": event.tenant,
        "deliver_at": event.deliver_at,
        "deliver_after": timedelta(seconds=event.delay) if event.delay else None,
        **_settings_params(),
    }
    ((event_id, created, deliveries, schema, sqlstate, said, detail),) = yield (
        queries.TRY_PUBLISH,
        params,
    )
    if sqlstate is not None:
        raise from_sqlstate(sqlstate, said, detail)
    if schema is not None:
        yield from _checked(event, schema, int(event_id))
    return Published(int(event_id), _deliveries(deliveries), created=bool(created))


def _checked(event: _CheckedEvent, schema: str, event_id: int) -> Steps:
    """The payload against its type's schema: undone and refused, or marked checked (the
    poller checks an unmarked one before sending: the SQL doors cannot)."""
    try:
        check_payload(event.event_type, schema, event.payload)
    except PayloadInvalid:
        yield queries.UNPUBLISH_CALL, {"event_id": event_id}
        raise
    yield queries.MARK_CHECKED, {"ids": [event_id]}


def _publish_many_steps(events: Sequence[_CheckedEvent]) -> Steps:
    """Any batch (ordered events included): poller_publish_many in the caller's
    savepoint; the new events' payloads then checked against their types' schemas (a
    refusal undoes the batch: its savepoint)."""
    params = {
        "event_types": [e.event_type for e in events],
        "payloads": [e.payload for e in events],
        "idempotency_keys": [e.idempotency_key for e in events],
        "tenants": [e.tenant for e in events],
        "ordering_keys": [e.ordering_key for e in events],
        "deliver_ats": [e.deliver_at for e in events],
        "deliver_afters": [timedelta(seconds=e.delay) if e.delay else None for e in events],
        **_settings_params(),
    }
    rows = yield queries.PUBLISH_MANY_CALL, params
    checked = set()
    for event, (event_id, created, _, schema) in zip(events, rows, strict=True):
        if created and schema is not None and event_id not in checked:
            check_payload(event.event_type, schema, event.payload)
            checked.add(event_id)
    if checked:
        yield queries.MARK_CHECKED, {"ids": sorted(checked)}
    return [
        Published(int(event_id), _deliveries(deliveries), created=bool(created))
        for event_id, created, deliveries, _ in rows
    ]


def event_row(
    endpoint: str,
    event_type: str,
    idempotency_key: str,
    ordering_key: str | None,
    event_id: int,
    deliver_at: datetime | None = None,
    delay: float = 0.0,
) -> NewRow:
    """A published event's row for one endpoint (replay's, poller/operate/replay.py): the event's
    key and ordering key, no payload of its own (the claim reads the event's), the
    endpoint's budget."""
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
    conn: Any,
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
    subscribed to it (poller/endpoints/subscriptions.py); return what it reached.

    ``conn``, ``payload``, ``deliver_after``, ``json_default`` and
    ``ordering_key`` (order per endpoint) mean what they mean for
    :func:`~poller.enqueue`, on the same connections. ``tenant``: only that tenant's
    endpoints; without it, only endpoints without a tenant.
    """
    door = Door(conn)
    event = check_event(
        Event(event_type, payload, idempotency_key, tenant, ordering_key, deliver_after),
        json_default,
    )
    if event.ordering_key is None:
        return door.drive(_publish_one_steps(event))  # type: ignore[no-any-return]
    with door.savepoint():
        return door.drive(_publish_many_steps([event]))[0]  # type: ignore[no-any-return]


def publish_many(
    conn: Any, events: Iterable[Event], *, json_default: JsonDefault | None = None
) -> list[Published]:
    """Publish many events at once (one statement for the batch); results in the
    order given. All are validated before any write; a conflict undoes this call's
    writes (savepoint) and raises."""
    door = Door(conn)
    checked = _check_all(events, json_default)
    if not checked:
        return []
    with door.savepoint():
        return list(door.drive(_publish_many_steps(checked)))


async def publish_async(
    conn: Any,
    *,
    event_type: str,
    payload: Any,
    idempotency_key: str,
    tenant: str | None = None,
    ordering_key: str | None = None,
    deliver_after: DeliverAfter = None,
    json_default: JsonDefault | None = None,
) -> Published:
    """:func:`publish` for the connections :func:`~poller.enqueue_async` takes."""
    door = AsyncDoor(conn)
    event = check_event(
        Event(event_type, payload, idempotency_key, tenant, ordering_key, deliver_after),
        json_default,
    )
    if event.ordering_key is None:
        return await door.drive(_publish_one_steps(event))  # type: ignore[no-any-return]
    async with door.savepoint():
        return (await door.drive(_publish_many_steps([event])))[0]  # type: ignore[no-any-return]


async def publish_many_async(
    conn: Any, events: Iterable[Event], *, json_default: JsonDefault | None = None
) -> list[Published]:
    """:func:`publish_many` for the connections :func:`~poller.enqueue_async` takes."""
    door = AsyncDoor(conn)
    checked = _check_all(events, json_default)
    if not checked:
        return []
    async with door.savepoint():
        return list(await door.drive(_publish_many_steps(checked)))
