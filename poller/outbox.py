"""The enqueue API: add messages inside the application's own transaction.

::

    from poller import enqueue

    with Session(engine) as session, session.begin():
        session.add(Invoice(id=42, paid=True))
        enqueue(session, endpoint="billing", event_type="invoice.paid",
                payload={"invoice": 42}, idempotency_key="invoice:42:paid")
    # committed: the invoice and its webhook exist together, or neither does

Nothing here commits. Pollers are woken by a NOTIFY that PostgreSQL delivers
only if the transaction commits. Input is validated before anything is written;
each kind of bad input raises its own exception (poller/errors.py).

Idempotency: the same (endpoint, key) with the same event type, payload and
ordering key returns the existing message's id; with a different one it raises
:class:`~poller.errors.IdempotencyConflict`. ``enqueue_many`` runs inside a
savepoint, so a conflict leaves none of its rows behind even if the caller
goes on to commit.

The sync and async functions share one sans-I/O implementation: a generator
that yields ``(statement, params)`` and receives the result rows.
"""

from __future__ import annotations

import math
from collections.abc import Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Row, TextClause
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import Session

from poller import queries
from poller.errors import (
    EndpointDisabled,
    IdempotencyConflict,
    IdempotencyKeySpent,
    NaiveDatetime,
    UnknownEndpoint,
)
from poller.errors import (
    EnqueueError as _EnqueueError,
)
from poller.names import check_event_type, check_key, check_ordering_key
from poller.ordering import Positions
from poller.payloads import JsonDefault, serialise_payload
from poller.settings import default_settings

MAX_DELAY = 100 * 365.25 * 86400.0  # seconds: deliver_after as a timedelta

DeliverAfter = datetime | timedelta | None
SyncConn = Session | Connection
AsyncConn = AsyncSession | AsyncConnection
_Steps = Generator[tuple[TextClause, Mapping[str, Any]], list[Row[Any]], Any]


@dataclass(frozen=True, slots=True)
class Message:
    """One message for :func:`enqueue_many`; the fields mean what enqueue's arguments mean."""

    endpoint: str
    event_type: str
    payload: Any
    idempotency_key: str
    deliver_after: DeliverAfter = None
    max_attempts: int | None = None
    ordering_key: str | None = None


@dataclass(frozen=True, slots=True)
class _Checked:
    endpoint: str
    event_type: str
    payload: str | None  # serialised JSON; None for a published event's row
    idempotency_key: str
    deliver_at: datetime | None
    delay: float
    max_attempts: int | None
    ordering_key: str | None = None
    event_id: int | None = None  # a published event's row (poller/publish.py): payload is None


# --- validation (pure) ---------------------------------------------------------


def _check_schedule(deliver_after: object) -> tuple[datetime | None, float]:
    if deliver_after is None:
        return None, 0.0
    if isinstance(deliver_after, datetime):
        if deliver_after.tzinfo is None or deliver_after.utcoffset() is None:
            raise NaiveDatetime(
                "deliver_after must be timezone-aware (e.g. datetime.now(timezone.utc)); "
                "a naive datetime is ambiguous"
            )
        return deliver_after, 0.0
    if isinstance(deliver_after, timedelta):
        seconds = deliver_after.total_seconds()
        if seconds < 0 or not math.isfinite(seconds):
            raise _EnqueueError("deliver_after must not be a negative timedelta")
        if seconds > MAX_DELAY:  # past it, now() + the delay overflows in PostgreSQL
            raise _EnqueueError("deliver_after must be at most 100 years away")
        return None, seconds
    kind = type(deliver_after).__name__
    raise _EnqueueError(f"deliver_after must be an aware datetime or a timedelta, not {kind}")


def _check_max_attempts(max_attempts: object) -> int | None:
    if max_attempts is None:
        return None
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
        raise _EnqueueError(f"max_attempts must be a positive integer, not {max_attempts!r}")
    return max_attempts


def _check_endpoint_name(endpoint: object) -> str:
    if not isinstance(endpoint, str) or not endpoint:
        raise UnknownEndpoint(str(endpoint))
    return endpoint


def check_message(
    message: Message, max_payload_bytes: int, json_default: JsonDefault | None = None
) -> _Checked:
    """Validate one message completely, writing nothing; raise the specific error."""
    deliver_at, delay = _check_schedule(message.deliver_after)
    return _Checked(
        endpoint=_check_endpoint_name(message.endpoint),
        event_type=check_event_type(message.event_type),
        payload=serialise_payload(message.payload, max_payload_bytes, json_default),
        idempotency_key=check_key(message.idempotency_key),
        deliver_at=deliver_at,
        delay=delay,
        max_attempts=_check_max_attempts(message.max_attempts),
        ordering_key=check_ordering_key(message.ordering_key),
    )


# --- the steps (sans I/O) ------------------------------------------------------


def _enqueue_one_steps(message: _Checked) -> _Steps:
    if message.ordering_key is not None:  # the key's lock and position: the batch path
        return (yield from _enqueue_many_steps([message]))[0]
    settings = default_settings()
    params = {
        "endpoint": message.endpoint,
        "event_type": message.event_type,
        "payload": message.payload,
        "idempotency_key": message.idempotency_key,
        "max_attempts": message.max_attempts,
        "default_max_attempts": settings.max_attempts,
        "deliver_at": message.deliver_at,
        "delay": message.delay,
        "notify": settings.notify,
    }
    inserted = yield queries.ENQUEUE_ONE, params
    if inserted:
        return int(inserted[0].id)
    found = yield queries.ENQUEUE_EXPLAIN, params
    if not found:
        raise UnknownEndpoint(message.endpoint)
    row = found[0]
    if not row.enabled:
        raise EndpointDisabled(message.endpoint, row.disabled_reason)
    if row.existing_id is None:  # purged meanwhile, or long ago
        raise IdempotencyKeySpent(message.endpoint, message.idempotency_key)
    if not row.same_content:
        raise IdempotencyConflict(message.endpoint, message.idempotency_key, row.existing_id)
    return int(row.existing_id)


def _dedupe_batch(checked: Sequence[_Checked]) -> list[int]:
    """Index of the first occurrence of each (endpoint, key); conflicts raise."""
    first: dict[tuple[str, str], int] = {}
    owner: list[int] = []
    for index, message in enumerate(checked):
        ident = (message.endpoint, message.idempotency_key)
        seen = first.setdefault(ident, index)
        if seen != index:
            earlier = checked[seen]
            if (earlier.payload, earlier.event_type, earlier.ordering_key) != (
                message.payload,
                message.event_type,
                message.ordering_key,
            ):
                raise IdempotencyConflict(message.endpoint, message.idempotency_key, -1)
        owner.append(seen)
    return owner


def _usable_endpoints(names: Sequence[str], rows: Sequence[Row[Any]]) -> dict[str, Row[Any]]:
    """The endpoints of a batch by name; UnknownEndpoint or EndpointDisabled otherwise."""
    endpoints = {row.name: row for row in rows}
    for name in names:
        if name not in endpoints:
            raise UnknownEndpoint(name)
        if not endpoints[name].enabled:
            raise EndpointDisabled(name, endpoints[name].disabled_reason)
    return endpoints


def _place_keyed(
    unique: Sequence[_Checked], endpoint_ids: Mapping[str, int]
) -> Generator[tuple[TextClause, Mapping[str, Any]], list[Row[Any]], Any]:
    """Lock the batch's ordering keys (sorted) and give each keyed message its status
    (poller/ordering.py); (None, [None…]) when none has a key."""
    keyed = [m for m in unique if m.ordering_key is not None]
    if not keyed:
        return None, [None] * len(unique)
    yield queries.LOCK_KEY_NAMES, {"ordering_keys": [m.ordering_key for m in keyed]}
    rows = yield (
        queries.LOCK_ORDERING_KEYS,
        {
            "endpoint_ids": [endpoint_ids[m.endpoint] for m in keyed],
            "ordering_keys": [m.ordering_key for m in keyed],
        },
    )
    positions = Positions(rows)
    statuses = [
        None
        if m.ordering_key is None
        else positions.place(endpoint_ids[m.endpoint], m.ordering_key)
        for m in unique
    ]
    return positions, statuses


def _enqueue_many_steps(checked: Sequence[_Checked]) -> _Steps:
    owner = _dedupe_batch(checked)
    unique = [m for i, m in enumerate(checked) if owner[i] == i]
    names = sorted({m.endpoint for m in unique})
    endpoints = _usable_endpoints(names, (yield queries.ENDPOINTS_BY_NAME, {"names": names}))
    ids = yield from insert_steps(unique, endpoints)
    return [ids[owner[i]] for i in range(len(checked))]


def insert_steps(unique: Sequence[_Checked], endpoints: Mapping[str, Row[Any]]) -> _Steps:
    """Insert these messages (no two with one (endpoint, key)) to these usable endpoints
    (rows like ENDPOINTS_BY_NAME's, by name); return their ids by index, an existing
    message's id for an idempotent repeat. Ordered ones are placed behind their keys'
    heads; a conflict or a spent key raises (the caller's savepoint undoes the rest)."""
    settings = default_settings()

    def budget(m: _Checked) -> int:
        endpoint_max = endpoints[m.endpoint].max_attempts
        return m.max_attempts or endpoint_max or settings.max_attempts

    positions, statuses = yield from _place_keyed(unique, {n: e.id for n, e in endpoints.items()})
    columns = {
        "endpoint_ids": [endpoints[m.endpoint].id for m in unique],
        "buckets": [endpoints[m.endpoint].bucket for m in unique],
        "event_types": [m.event_type for m in unique],
        "payloads": [m.payload for m in unique],
        "idempotency_keys": [m.idempotency_key for m in unique],
        "max_attempts": [budget(m) for m in unique],
        "deliver_ats": [m.deliver_at for m in unique],
        "delays": [m.delay for m in unique],
        "ordering_keys": [m.ordering_key for m in unique],
        "statuses": statuses,
        "event_ids": [m.event_id for m in unique],
    }
    inserted = yield queries.ENQUEUE_MANY, columns
    heads = positions.finish(inserted) if positions is not None else None
    if heads is not None:
        yield queries.SET_ORDERING_HEADS, heads
    ids = {(row.endpoint_id, row.idempotency_key): int(row.id) for row in inserted}
    if len(ids) < len(unique):
        existing = yield queries.ENQUEUE_MANY_EXISTING, columns
        for row in existing:
            if (row.endpoint_id, row.idempotency_key) in ids:
                continue
            if not row.same_content:
                name = next(n for n, e in endpoints.items() if e.id == row.endpoint_id)
                raise IdempotencyConflict(name, row.idempotency_key, row.id)
            ids[(row.endpoint_id, row.idempotency_key)] = int(row.id)
        for m in unique:
            if (endpoints[m.endpoint].id, m.idempotency_key) not in ids:
                raise IdempotencyKeySpent(m.endpoint, m.idempotency_key)
    if inserted and settings.notify:
        buckets = sorted({endpoints[m.endpoint].bucket for m in unique})
        yield queries.NOTIFY_BUCKETS, {"buckets": buckets}
    return [ids[(endpoints[m.endpoint].id, m.idempotency_key)] for m in unique]


def drive(conn: SyncConn, steps: _Steps) -> Any:
    result: list[Row[Any]] | None = None
    try:
        while True:
            statement, params = steps.send(result)  # type: ignore[arg-type]
            result = list(conn.execute(statement, params).all())
    except StopIteration as done:
        return done.value


async def drive_async(conn: AsyncConn, steps: _Steps) -> Any:
    result: list[Row[Any]] | None = None
    try:
        while True:
            statement, params = steps.send(result)  # type: ignore[arg-type]
            result = list((await conn.execute(statement, params)).all())
    except StopIteration as done:
        return done.value


def _message(
    endpoint: str,
    event_type: str,
    payload: Any,
    idempotency_key: str,
    deliver_after: DeliverAfter,
    max_attempts: int | None,
    json_default: JsonDefault | None,
    ordering_key: str | None,
) -> _Checked:
    return check_message(
        Message(
            endpoint,
            event_type,
            payload,
            idempotency_key,
            deliver_after,
            max_attempts,
            ordering_key,
        ),
        default_settings().max_payload_bytes,
        json_default,
    )


def _check_all(messages: Iterable[Message], json_default: JsonDefault | None) -> list[_Checked]:
    limit = default_settings().max_payload_bytes
    checked = []
    for index, message in enumerate(messages):
        if not isinstance(message, Message):
            raise _EnqueueError(f"messages[{index}] must be a poller.Message")
        checked.append(check_message(message, limit, json_default))
    return checked


# --- public API ----------------------------------------------------------------


def enqueue(
    conn: SyncConn,
    *,
    endpoint: str,
    event_type: str,
    payload: Any,
    idempotency_key: str,
    deliver_after: DeliverAfter = None,
    max_attempts: int | None = None,
    json_default: JsonDefault | None = None,
    ordering_key: str | None = None,
) -> int:
    """Add one webhook message in the caller's transaction; return its id.

    ``conn`` is a SQLAlchemy ``Session`` or ``Connection`` whose transaction the
    caller commits. ``payload`` is a JSON object — a dict, a pydantic model or
    a dataclass, holding datetimes, Decimals, UUIDs… as :func:`encode_value`
    describes; ``json_default`` encodes other types. The JSON text it becomes
    is stored and sent byte for byte. ``deliver_after`` (aware datetime, or
    timedelta from the database's now) delays the first attempt;
    ``max_attempts`` overrides the endpoint's and the global attempt budget.
    Messages with the same ``ordering_key`` (and endpoint) are delivered one at
    a time, in the order enqueued (poller/ordering.py).
    """
    message = _message(
        endpoint,
        event_type,
        payload,
        idempotency_key,
        deliver_after,
        max_attempts,
        json_default,
        ordering_key,
    )
    return int(drive(conn, _enqueue_one_steps(message)))


def enqueue_many(
    conn: SyncConn, messages: Iterable[Message], *, json_default: JsonDefault | None = None
) -> list[int]:
    """Add many messages in one statement; return their ids in the order given.

    Validation happens for all of them before any write; an idempotency
    conflict rolls back this call's rows (savepoint) and raises.
    """
    checked = _check_all(messages, json_default)
    if not checked:
        return []
    with conn.begin_nested():
        return list(drive(conn, _enqueue_many_steps(checked)))


async def enqueue_async(
    conn: AsyncConn,
    *,
    endpoint: str,
    event_type: str,
    payload: Any,
    idempotency_key: str,
    deliver_after: DeliverAfter = None,
    max_attempts: int | None = None,
    json_default: JsonDefault | None = None,
    ordering_key: str | None = None,
) -> int:
    """:func:`enqueue` for an ``AsyncSession`` or ``AsyncConnection``."""
    message = _message(
        endpoint,
        event_type,
        payload,
        idempotency_key,
        deliver_after,
        max_attempts,
        json_default,
        ordering_key,
    )
    return int(await drive_async(conn, _enqueue_one_steps(message)))


async def enqueue_many_async(
    conn: AsyncConn, messages: Iterable[Message], *, json_default: JsonDefault | None = None
) -> list[int]:
    """:func:`enqueue_many` for an ``AsyncSession`` or ``AsyncConnection``."""
    checked = _check_all(messages, json_default)
    if not checked:
        return []
    async with conn.begin_nested():
        return list(await drive_async(conn, _enqueue_many_steps(checked)))
