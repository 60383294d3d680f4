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

The rows are written by the kernel every write path shares (poller/insert.py).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Row

from poller import actors, queries
from poller.errors import (
    EndpointDisabled,
    IdempotencyConflict,
    IdempotencyKeySpent,
    UnknownEndpoint,
)
from poller.errors import (
    EnqueueError as _EnqueueError,
)
from poller.insert import (
    AsyncConn,
    DeliverAfter,
    NewRow,
    Steps,
    SyncConn,
    check_max_attempts,
    check_schedule,
    drive,
    drive_async,
    insert_rows,
)
from poller.names import check_event_type, check_key, check_ordering_key
from poller.payloads import JsonDefault, serialise_payload
from poller.settings import default_settings
from poller.tracing import trace_params


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


# --- validation (pure) ---------------------------------------------------------


def _check_endpoint_name(endpoint: object) -> str:
    if not isinstance(endpoint, str) or not endpoint:
        raise UnknownEndpoint(str(endpoint))
    return endpoint


def check_message(
    message: Message, max_payload_bytes: int, json_default: JsonDefault | None = None
) -> NewRow:
    """Validate one message completely, writing nothing; raise the specific error."""
    deliver_at, delay = check_schedule(message.deliver_after)
    return NewRow(
        endpoint=_check_endpoint_name(message.endpoint),
        event_type=check_event_type(message.event_type),
        payload=serialise_payload(message.payload, max_payload_bytes, json_default),
        idempotency_key=check_key(message.idempotency_key),
        deliver_at=deliver_at,
        delay=delay,
        max_attempts=check_max_attempts(message.max_attempts),
        ordering_key=check_ordering_key(message.ordering_key),
    )


# --- the steps (sans I/O) ------------------------------------------------------


def _enqueue_one_steps(message: NewRow) -> Steps:
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
        **trace_params(),  # the application's span, if it has one (poller/tracing.py)
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


def _dedupe_batch(checked: Sequence[NewRow]) -> list[int]:
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


def _enqueue_many_steps(checked: Sequence[NewRow]) -> Steps:
    owner = _dedupe_batch(checked)
    unique = [m for i, m in enumerate(checked) if owner[i] == i]
    names = sorted({m.endpoint for m in unique})
    endpoints = _usable_endpoints(names, (yield queries.ENDPOINTS_BY_NAME, {"names": names}))
    ids = yield from insert_rows(unique, endpoints)
    return [ids[owner[i]] for i in range(len(checked))]


def _message(
    endpoint: str,
    event_type: str,
    payload: Any,
    idempotency_key: str,
    deliver_after: DeliverAfter,
    max_attempts: int | None,
    json_default: JsonDefault | None,
    ordering_key: str | None,
) -> NewRow:
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


def _check_all(messages: Iterable[Message], json_default: JsonDefault | None) -> list[NewRow]:
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


TEST_EVENT = "webhook_poller.test"


def send_test_event(
    conn: SyncConn, endpoint: str, sent_by: str, tenant: str | None = None
) -> tuple[int, str]:
    """Queue a test event for ``endpoint`` (``webhook_poller.test``, signed and retried
    as any other, by the pollers): its message id and idempotency key. The API's and
    the portal's "send a test event". The endpoint's receiver is ``tenant``'s: it reads
    ``sent_by`` as that tenant may see it (an operator is ``operator``)."""
    key = f"test:{secrets.token_hex(8)}"
    shown = actors.seen_by(sent_by, tenant)
    payload = {"test": True, "endpoint": endpoint, "sent_by": shown}
    return enqueue(conn, endpoint=endpoint, event_type=TEST_EVENT, payload=payload,
                   idempotency_key=key), key  # fmt: skip
