"""Ordered delivery: per (endpoint, ordering key), one message at a time, in order.

::

    enqueue(session, endpoint="shop", event_type="order.paid", payload=...,
            idempotency_key="order:42:paid", ordering_key="order:42")

**The guarantee.** For one endpoint and one ordering key, message *n+1* is not
sent before message *n* has ended: delivered, or failed for good and then
skipped (by the endpoint's ``on_failed_head="skip"`` or ``poller admin skip``).
Retries with backoff, lookups, reclaims after a crash and graceful releases
all keep the key's head the head. Messages without a key are not affected.

**How.** A key with an open message has a row in ``poller_ordering_keys``.
Enqueue locks (or creates) it — held until the application's transaction
ends — and inserts the message ``pending`` if the key has no open message, so
it becomes the key's *head*, or ``waiting`` otherwise. Waiting rows are not in
the claim path's index at all, so a long key costs the claim nothing. When a
head ends, the transaction that records the outcome locks the key's row and
hands the key to its next waiting message (:data:`~poller.store.queries.ADVANCE_KEYS`),
or deletes the row when none waits: the table holds live keys only. It never
waits for that lock: while an application's transaction holds the key (it
enqueued on it and has not committed), the completion leaves the key, the
poller hands it on at its next completion (within
:data:`~poller.complete.completer.CARRY_INTERVAL` when idle), and the maintenance
sweep hands on any key a stopped poller left (within a minute). So a transaction left open on
key K delays K's next message and nothing else. A head
that failed for good on a ``block`` endpoint (the default) stays the head and
the key is *blocked* until an operator retries or skips it
(``poller admin blocked``).

**Positions.** A message's position in its key is its event's id for a
published event's delivery, and its own id for an enqueued message; events
and messages draw ids from one sequence, so positions on one key compare
whichever way its messages came. A key's messages are inserted while its row
is locked, so their positions grow in the order the transactions took the
key (for events: when the application serialises its changes to the key, as
below). The next message is the waiting one with the lowest id.

**Order** is the order in which transactions took the key: positions are
given under a lock on the key's name (taken before a publish numbers its
events, and before the key's rows are locked), so two concurrent transactions
on one key — enqueue or publish — are serialised by PostgreSQL and ordered by
commit. Only applications take that lock: it never holds up a poller. What the application must do
is enqueue a key's events in the order they happened — usually true already,
since they come from changes to the same row, which the application locks
(``SELECT … FOR UPDATE`` on the order) before changing it. A transaction that
enqueues on several keys takes their locks in the order it enqueues; pass
them to one ``enqueue_many`` call (which sorts them) to avoid deadlocks.

**Receivers** get ``webhook-ordering-key`` and ``webhook-ordering-seq`` (the
position, growing within a key but not by one). What a receiver may rely on:

* a higher position is a later event of the key, always — through retries,
  reclaims, operator retries and replays;
* live messages of a key arrive one at a time in position order;
* a message sent again — an operator's retry, a replay — keeps its position,
  and so does an event a replay delivers for the first time (the endpoint was
  disabled, or subscribed later): these may arrive after higher positions.

So a receiver that applies a message only when its position is higher than the
last one it applied for the key (and ignores, or merges, a lower one) is
correct in every case (tests/integration/test_fanout.py replays through a
disabled spell to show it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.ext.asyncio import AsyncConnection

from poller.endpoints.checks import could_be_name
from poller.store import queries

ENDED = frozenset({"delivered", "failed"})  # how a poller's completion ends a message


@dataclass(slots=True)
class HandOver:
    promoted: int = 0  # buckets where a key's next message became due (ADVANCE_KEYS)
    busy: list[int] = field(default_factory=list)  # ended heads whose key row was held


_ID = ("id",)
_ADVANCED = ("what", "bucket", "woke")  # ADVANCE_KEYS's columns, checked by fetch


async def hand_on(conn: AsyncConnection, ids: Sequence[int], *, notify: bool = True) -> HandOver:
    """Hand on the keys whose head is one of ``ids`` (which just ended), in the caller's
    transaction, without waiting: a key whose row someone holds (an application's
    transaction enqueueing on it) is left, and its head comes back in ``busy`` for
    the caller to try again later (:data:`~poller.store.queries.ENDED_HEADS` finds any
    left behind for good). The statements go to the psycopg connection itself, in
    the caller's transaction, as the claim path's do (:func:`poller.store.db.fetch`):
    through SQLAlchemy's async adapter they were a fifth of the event loop's time
    in a drain of ordered messages."""
    from poller.store.db import fetch  # here: an application importing poller loads no metrics

    if not ids:
        return HandOver()
    heads = await fetch(conn, queries.TAKE_KEYS_OF_HEADS, {"ids": list(ids)}, columns=_ID)
    taken = [head_id for (head_id,) in heads]
    busy = sorted(set(ids) - set(taken))
    if busy:  # skipped, or no key's head (any more): only the first kind is for later
        still = await fetch(conn, queries.HEADS_AMONG, {"ids": busy}, columns=_ID)
        busy = sorted(head_id for (head_id,) in still)
    if not taken:
        return HandOver(busy=busy)
    params = {"ids": taken, "skipped": [], "notify": notify}
    result = await fetch(conn, queries.ADVANCE_KEYS, params, columns=_ADVANCED)
    promoted = sum(1 for row in result if row[0] == "promoted")
    return HandOver(promoted=promoted, busy=busy)


async def hand_on_ended(conn: AsyncConnection, limit: int = 1000) -> int:
    """Maintenance: hand on keys whose head ended but was not handed on (see
    :func:`hand_on`); returns how many keys."""
    ids = [row.id for row in await conn.execute(queries.ENDED_HEADS, {"limit": limit})]
    if ids:
        await conn.execute(queries.ADVANCE_KEYS, {"ids": ids, "skipped": [], "notify": True})
    return len(ids)


def advance_keys_sync(
    conn: Connection, ids: Sequence[int], skipped: Sequence[int] = (), *, notify: bool = True
) -> list[Any]:
    """Hand on the keys whose head is one of ``ids``, waiting for their rows (the admin
    commands: an operator may wait; a poller never does, :func:`hand_on`)."""
    params = {"ids": list(ids)}
    conn.execute(queries.LOCK_KEYS_OF_HEADS, params)
    result = conn.execute(
        queries.ADVANCE_KEYS, {**params, "skipped": list(skipped), "notify": notify}
    )
    return list(result.all())


# --- operators (poller admin blocked / skip / retry) -------------------------------


def blocked_keys(
    conn: Connection, *, endpoint: str | None = None, limit: int = 100
) -> list[dict[str, Any]]:
    """Blocked keys, longest blocked first: endpoint, key, head message, its last error,
    how many messages wait behind it, and since when."""
    if endpoint is not None and not could_be_name(endpoint):
        return []  # no endpoint has that name (PostgreSQL would refuse a NUL in it)
    rows = conn.execute(queries.BLOCKED_KEYS, {"endpoint": endpoint, "limit": limit})
    return [dict(row._mapping) for row in rows]


def requeue_keyed(conn: Connection, messages: Sequence[tuple[int, int, str]]) -> None:
    """Retried ordered messages ((id, endpoint_id, ordering_key)…) back in line, in the
    retry's transaction: lock (or create) their keys' rows, then REQUEUE_KEYED."""
    if messages:
        conn.execute(
            queries.LOCK_ORDERING_KEYS,
            {
                "endpoint_ids": [endpoint_id for _, endpoint_id, _ in messages],
                "ordering_keys": [key for _, _, key in messages],
            },
        )
        conn.execute(queries.REQUEUE_KEYED, {"ids": [msg_id for msg_id, _, _ in messages]})


def skip_messages(conn: Connection, ids: Sequence[int], *, who: str) -> list[int]:
    """End these ordered messages as failed (skipped by ``who``) and move their keys on.

    Only messages with an ordering key that are not in flight are skipped; the
    ids skipped are returned.
    """
    conn.execute(queries.LOCK_KEYS_OF_MESSAGES, {"ids": list(ids)})  # before their rows
    skipped = [
        row.id for row in conn.execute(queries.SKIP_MESSAGES, {"ids": list(ids), "who": who})
    ]
    if skipped:
        advance_keys_sync(conn, skipped, skipped)
    return skipped
