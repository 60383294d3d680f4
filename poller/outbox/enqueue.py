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

The rows are written by the database's functions every door shares
(db/sql/0026_doors.sql, run through poller/outbox/doors.py on any kind of connection).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from poller.errors import EnqueueError as _EnqueueError
from poller.errors import UnknownEndpoint, from_sqlstate
from poller.outbox.doors import AsyncDoor, Door, Steps
from poller.outbox.insert import (
    DeliverAfter,
    NewRow,
    SyncConn,
    check_max_attempts,
    check_schedule,
)
from poller.rules import actors
from poller.rules.names import check_event_type, check_key, check_ordering_key
from poller.rules.payloads import JsonDefault, serialise_payload
from poller.rules.tracing import trace_params
from poller.settings import default_settings
from poller.store import queries


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


def _write_params(message: NewRow) -> dict[str, Any]:
    """What the database's doors take of a checked message, with this process's settings
    (the SQL doors read the database's, which ``poller db upgrade`` writes from them)."""
    settings = default_settings()
    return {
        "endpoint": message.endpoint,
        "event_type": message.event_type,
        "payload": message.payload,
        "idempotency_key": message.idempotency_key,
        "ordering_key": message.ordering_key,
        "deliver_at": message.deliver_at,
        "deliver_after": timedelta(seconds=message.delay) if message.delay else None,
        "max_attempts": message.max_attempts,
        "max_payload_bytes": settings.max_payload_bytes,
        "default_max_attempts": settings.max_attempts,
        "notify": settings.notify,
        **trace_params(),  # the application's span, if it has one (poller/rules/tracing.py)
    }


def _enqueue_one_steps(message: NewRow) -> Steps:
    """One message through poller_try_enqueue: its id, or the refusal it raises (the
    caller's transaction stays usable, as after any exception in Python)."""
    ((message_id, sqlstate, said, detail),) = yield queries.TRY_ENQUEUE, _write_params(message)
    if sqlstate is not None:
        raise from_sqlstate(sqlstate, said, detail)
    return int(message_id)


def _enqueue_many_steps(checked: Sequence[NewRow]) -> Steps:
    """A batch through poller_enqueue_many (in the caller's savepoint): ids in order."""
    settings = default_settings()
    params = {
        "endpoints": [m.endpoint for m in checked],
        "event_types": [m.event_type for m in checked],
        "payloads": [m.payload for m in checked],
        "idempotency_keys": [m.idempotency_key for m in checked],
        "ordering_keys": [m.ordering_key for m in checked],
        "deliver_ats": [m.deliver_at for m in checked],
        "deliver_afters": [timedelta(seconds=m.delay) if m.delay else None for m in checked],
        "max_attempts": [m.max_attempts for m in checked],
        "max_payload_bytes": settings.max_payload_bytes,
        "default_max_attempts": settings.max_attempts,
        "notify": settings.notify,
        **trace_params(),
    }
    ((ids,),) = yield queries.ENQUEUE_MANY_CALL, params
    return [int(i) for i in ids]


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
    conn: Any,
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

    ``conn`` is the application's connection, whose transaction it commits: a
    SQLAlchemy ``Session`` or ``Connection``, a psycopg 3 ``Connection``, a psycopg2
    connection, or Django's (``poller.contrib.django.enqueue``). ``payload`` is a JSON
    object — a dict, a pydantic model or a dataclass, holding datetimes, Decimals,
    UUIDs… as :func:`encode_value` describes; ``json_default`` encodes other types.
    The JSON text it becomes is stored and sent byte for byte. ``deliver_after``
    (aware datetime, or timedelta from the database's now) delays the first attempt;
    ``max_attempts`` overrides the endpoint's and the global attempt budget.
    Messages with the same ``ordering_key`` (and endpoint) are delivered one at a
    time, in the order enqueued (poller/rows/ordering.py). The write is the database's
    ``poller_try_enqueue`` (db/sql/0026_doors.sql), as for every door.
    """
    door = Door(conn)
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
    return int(door.drive(_enqueue_one_steps(message)))


def enqueue_many(
    conn: Any, messages: Iterable[Message], *, json_default: JsonDefault | None = None
) -> list[int]:
    """Add many messages in one statement; return their ids in the order given.

    Validation happens for all of them before any write; an idempotency
    conflict rolls back this call's rows (savepoint) and raises.
    """
    door = Door(conn)
    checked = _check_all(messages, json_default)
    if not checked:
        return []
    with door.savepoint():
        return list(door.drive(_enqueue_many_steps(checked)))


async def enqueue_async(
    conn: Any,
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
    """:func:`enqueue` for an ``AsyncSession`` or ``AsyncConnection`` of SQLAlchemy, a
    psycopg 3 ``AsyncConnection`` or an asyncpg ``Connection``."""
    door = AsyncDoor(conn)
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
    return int(await door.drive(_enqueue_one_steps(message)))


async def enqueue_many_async(
    conn: Any, messages: Iterable[Message], *, json_default: JsonDefault | None = None
) -> list[int]:
    """:func:`enqueue_many` for the connections :func:`enqueue_async` takes."""
    door = AsyncDoor(conn)
    checked = _check_all(messages, json_default)
    if not checked:
        return []
    async with door.savepoint():
        return list(await door.drive(_enqueue_many_steps(checked)))


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
