"""Operators' holds: cancel messages for good, pause an endpoint for a while.

**Cancel** (``poller admin cancel``) ends pending and waiting messages
``cancelled``, a terminal state only an operator enters: counted in
``admin stats``, the metrics and the dashboard, recorded as a ``manual`` attempt
naming who, and handled by ordered keys like a skipped head (the key moves on).
A message in flight is never cancelled — its poller holds it and it ends as its
attempt says — and neither is one being claimed at that instant: the cancel
skips rows and keys someone holds and reports them, so it waits on nobody and
nobody waits on it, and a message ends one way, counted once. ``admin retry``
sends a cancelled message after all.

**Pause** (``poller endpoints pause``) holds an endpoint's messages — they are
not claimed — until a time or until ``resume``, without touching its health,
attempts or circuit. ``disable`` is for a broken endpoint (enqueue refuses it,
enable resets its health); pause is for a receiver that asked for quiet, a
maintenance window, a customer's freeze. It is stored on the endpoint, so it
holds across restarts of every poller. Messages in flight when it starts end as
their attempts say.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, Engine

from poller.endpoints.checks import could_be_name
from poller.errors import InvalidInput, UnknownEndpoint
from poller.operate.admin import RETRY_BATCH, actor
from poller.rules.names import could_be_event_type
from poller.rules.parse import could_be_row_id
from poller.store import queries
from poller.store.queries import admin as built
from poller.store.queries import cancel as holds

OPEN = ("pending", "waiting")


@dataclass(frozen=True, slots=True)
class CancelFilter:
    """Which open messages: of an endpoint, optionally of one event type, created in
    [since, until)."""

    endpoint: str
    event_type: str | None = None
    since: datetime | None = None
    until: datetime | None = None

    def where(self, conn: Connection) -> list[Any]:
        if not could_be_name(self.endpoint):
            raise UnknownEndpoint(self.endpoint)
        endpoint_id = conn.execute(queries.ENDPOINT_ID, {"name": self.endpoint}).scalar()
        if endpoint_id is None:
            raise UnknownEndpoint(self.endpoint)
        return holds.open_where(  # OPEN's messages
            endpoint_id,
            event_type=self.event_type,
            since=self.since,
            until=self.until,
            possible=self.event_type is None or could_be_event_type(self.event_type),
        )


@dataclass(frozen=True, slots=True)
class CancelResult:
    cancelled: list[int]
    refused: dict[int, str] = field(default_factory=dict)  # id -> why it was left alone


def plan_cancel(
    conn: Connection, ids: Sequence[int] | None = None, *, where: CancelFilter | None = None
) -> CancelResult:
    """Which messages a cancel would end (``cancelled``: the candidates), and why the
    others given by id would be left alone. Nothing changes."""
    if ids:
        rows: dict[int, str] = {r.id: r.status for r in conn.execute(built.statuses(ids))}
        refused = {i: _why(rows.get(i)) for i in ids if rows.get(i) not in OPEN}
        return CancelResult(sorted(i for i, s in rows.items() if s in OPEN), refused)
    if where is None:
        raise InvalidInput("give message ids, or an endpoint to cancel its open messages")
    found = conn.execute(built.statuses(where=where.where(conn)))
    return CancelResult([r.id for r in found])


def _why(status: str | None) -> str:
    if status is None:
        return "not found"
    if status == "in_flight":
        return "in flight: it ends as its attempt says (cancel it again if it is retried)"
    return f"already {status}"


def cancel_messages(engine: Engine, ids: Sequence[int], *, who: str | None = None) -> CancelResult:
    """End these messages ``cancelled`` (those pending or waiting), in batches; the
    others are returned with why: in flight, ended, or busy this instant (being
    claimed, or an application's transaction holds its ordering key)."""
    who = who or actor()
    done: list[int] = []
    rows_ids = [i for i in ids if could_be_row_id(i)]  # another names no row: "not found"
    for start in range(0, len(rows_ids), RETRY_BATCH):
        chunk = rows_ids[start : start + RETRY_BATCH]
        with engine.begin() as conn:
            keyed = conn.execute(queries.TAKE_KEYS_OF_MESSAGES, {"ids": chunk}).scalars().all()
            rows = conn.execute(
                queries.CANCEL_MESSAGES, {"ids": chunk, "keyed": list(keyed), "who": who}
            ).all()
            heads = [r.id for r in rows if r.ordering_key is not None]
            if heads:  # their keys are held here: hand them on (ADVANCE_KEYS skips non-heads)
                conn.execute(queries.ADVANCE_KEYS, {"ids": heads, "skipped": [], "notify": True})
        done += [r.id for r in rows]
    left = sorted(set(ids) - set(done))
    refused: dict[int, str] = {}
    if left:
        with engine.connect() as conn:
            known = [i for i in left if could_be_row_id(i)]
            statuses = {r.id: r.status for r in conn.execute(built.statuses(known))}
        for i in left:
            status = statuses.get(i)
            refused[i] = (
                "busy this instant (being claimed, or its ordering key is held by an open "
                "transaction): try again"
                if status in OPEN
                else _why(status)
            )
    return CancelResult(sorted(done), refused)


# --- pause ---------------------------------------------------------------------------


def pause_endpoint(
    conn: Connection, name: str, *, until: datetime | None = None, who: str | None = None
) -> dict[str, Any]:
    """Hold the endpoint's messages until ``until`` (None: until :func:`resume_endpoint`)."""
    if until is not None and until.tzinfo is None:
        raise InvalidInput("until must be timezone-aware")
    if until is not None and until <= datetime.now(UTC):
        raise InvalidInput(f"--until {until.isoformat()} is not in the future")
    if not could_be_name(name):
        raise UnknownEndpoint(name)
    row = conn.execute(
        queries.HOLD_ENDPOINT,
        {"name": name, "until": until, "who": who or actor()},
    ).one_or_none()
    if row is None:
        raise UnknownEndpoint(name)
    return {"name": name, "held_until": until, "held_by": row.held_by}


def resume_endpoint(conn: Connection, name: str) -> None:
    """End the endpoint's pause now and wake the pollers of its bucket."""
    if (
        not could_be_name(name)
        or conn.execute(queries.RELEASE_ENDPOINT, {"name": name}).one_or_none() is None
    ):
        raise UnknownEndpoint(name)
