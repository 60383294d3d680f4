"""Completions: the fenced writes that end a claimed attempt, and what follows from them.

Every write for an attempt — delivered, retry, unknown, failed, released — is
conditional on ``(id, claim_token, status = 'in_flight')`` (poller/rows/claims.py):
a write from a claim that expired and was taken over matches nothing and comes
back *stale*. :meth:`Completions.complete` applies any mix of outcomes
(poller/rules/outcomes.py) in one statement and records each attempt in
``poller_delivery_attempts`` in the same transaction; then the follow-ups —
the endpoints' health (poller/rows/judging.py), the hand-over of ended ordered heads
(poller/rows/ordering.py), operational events (poller/rows/events.py) — none of which
waits on a row an application or operator holds. :meth:`Completions.reclaim_expired`
and :meth:`Completions.sweep_follow_ups` are the maintenance leader's share.

A :class:`~poller.rows.claims.Claims` makes its own (``claims.completions``) and
completes through it (``claims.complete``)::

    batch = await claims.claim_batch(limit=100)
    result = await claims.complete([delivered(m, status_code=200) for m in batch])
    assert not result.stale
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from poller.observe.logs import OutageLog
from poller.rows.events import EventSink, OperationalEvent
from poller.rows.judging import Signal, health_signals, judging_due, signals_json
from poller.rows.ordering import ENDED, HandOver, hand_on, hand_on_ended
from poller.rules.health import HealthPolicy
from poller.rules.outcomes import Outcome, outcomes_json
from poller.store import queries
from poller.store.db import Autocommit, fetch, is_transient

log = logging.getLogger("poller.rows.completions")


@dataclass(slots=True)
class CompletionResult:
    applied: list[int] = field(default_factory=list)
    stale: list[int] = field(default_factory=list)  # fenced out, or their row was deleted
    # outcomes whose row someone else held locked: carried, written by a later call
    busy: list[int] = field(default_factory=list)
    # the outcomes this call ended (applied or stale), earlier calls' carried ones too:
    # their claims are no longer held
    ended: list[Outcome] = field(default_factory=list)
    promoted: int = 0  # buckets where an ordered message became its key's head (now due)
    events: list[OperationalEvent] = field(default_factory=list)  # for hooks, after commit
    opened: int = 0  # circuits this completion opened


@dataclass(slots=True)
class ReclaimResult:
    pending: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    events: list[OperationalEvent] = field(default_factory=list)


_COMPLETED_FIELDS = ("id", "endpoint_id", "status", "ordering_key", "healthy", "backlog")


def _news_free(outcome: Outcome) -> bool:
    """An outcome whose follow-ups may come after its row is written: a delivery, or an
    attempt handed back unsent — nothing a circuit, a pause or an event waits on."""
    if outcome.status == "failed":
        return False
    return outcome.outcome == "delivered" or outcome.kind not in ("send", "lookup")


@dataclass(slots=True)
class _FollowUps:
    """What follows from a completion (Completions.complete)."""

    signals: dict[int, Signal]  # per endpoint, for JUDGE_HEALTH
    judge: bool  # JUDGE_HEALTH would change something (poller/rows/judging.py)
    heads: list[int]  # ended ordered heads (and busy ones carried): keys to hand on
    failed: list[int]  # messages failed for good: their operational events


class Completions:
    """Complete claimed rows for one poller; each call is one short transaction (or a
    statement and then one, with ``follow_ups_apart``: :meth:`complete`).

    ``stale_completions`` counts writes refused by the claim-token fence.
    """

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        poller_id: str,
        health: HealthPolicy | None = None,
        events: EventSink | None = None,
        follow_ups_apart: bool = False,
    ) -> None:
        self.engine = engine
        # COMPLETE_BATCH alone, when its follow-ups may come after it (complete())
        self.follow_ups_apart = follow_ups_apart
        self.completing = Autocommit(engine, generic_plans=False)
        self.poller_id = poller_id
        self.health = health or HealthPolicy()  # poller/rules/health.py
        self._health_params = self.health.params()
        self.events = events or EventSink()  # poller/rows/events.py
        self.stale_completions = 0
        # Ended heads whose key row was busy: handed on by the next completion; and
        # health signals of written rows whose follow-ups met a database away.
        self._carried_heads: set[int] = set()
        self._carried_signals: dict[int, Signal] = {}
        # Outcomes whose row someone else held locked (an operator's open UPDATE or
        # DELETE): written again with the next call, until their row is free or gone.
        self._carried_outcomes: dict[int, Outcome] = {}
        self._busy_outage = False  # warned about busy rows, not yet all written
        self._follow_up_outage = OutageLog("following up completions")

    async def close(self) -> None:
        """Close the connection the completions go through (the engine stays the caller's)."""
        await self.completing.close()

    async def complete(self, outcomes: Sequence[Outcome]) -> CompletionResult:
        """Apply outcomes (any mix) in one fenced statement; report which were stale.

        What follows, without waiting on any row someone else holds: the
        endpoints' health learns from the applied sends (JUDGE_HEALTH, when it
        would change anything: poller/rows/judging.py; an endpoint whose rows are busy
        gets them in the health backlog), the keys of ended ordered heads are
        handed on (poller/rows/ordering.py), and operational events for what changed
        (and for messages that failed for good) are enqueued; the events are
        returned for the in-process hooks. A key locked by an application's open
        transaction is carried to the next call (:attr:`carried`), which an idle
        completer makes soon; so is an outcome whose own row someone else holds
        locked (an operator's open ``UPDATE`` or ``DELETE`` on ``poller_outbox``):
        it is in ``busy``, the others are written at once, and a later call writes
        it when the lock goes — or finds its row gone (``stale``, nothing recorded).

        All in one transaction — unless ``follow_ups_apart`` and every outcome is a
        delivery or sent nothing (:func:`_news_free`): then COMPLETE_BATCH is a
        statement of its own, on a connection of its own, and the follow-ups, if
        any, a transaction after it. A failure is judged in the transaction that
        makes its row due again, so a circuit it opens is open before the row can
        be claimed; a message failed for good gets its event with its row.
        Follow-ups that fail after the rows were written are carried to the next
        call (the database is away) or dropped with an error logged (the sweep
        hands on what a lost hand-over left: :meth:`sweep_follow_ups`); the rows
        stay written.
        """
        if self._carried_outcomes:  # rows someone held: tried again with these
            outcomes = [*self._carried_outcomes.values(), *outcomes]
        if not outcomes and not self.carried:
            return CompletionResult()
        params = outcomes_json(outcomes, self.poller_id)
        if self.follow_ups_apart and all(map(_news_free, outcomes)):
            rows = await self._complete_rows(self.completing.fetch, params) if outcomes else []
            work = self._follow_ups(outcomes, rows)
            handed, events, transitions = await self._follow_up_apart(work)
        else:  # a failed message's event is enqueued with its row
            async with self.engine.begin() as conn:
                rows = await self._complete_rows(partial(fetch, conn), params) if outcomes else []
                work = self._follow_ups(outcomes, rows)
                handed, events, transitions = await self._follow_up(conn, work)
            self._followed_up(handed)
        busy = self._carry_busy(outcomes, rows)
        applied = {row[0] for row in rows}
        ended = [o for o in outcomes if o.message_id not in busy]
        result = CompletionResult(
            applied=[o.message_id for o in ended if o.message_id in applied],
            stale=[o.message_id for o in ended if o.message_id not in applied],
            busy=sorted(busy),
            ended=ended,
            promoted=handed.promoted,
            events=events,
            opened=sum(1 for t in transitions if t["was"] == "closed" and t["state"] == "open"),
        )
        self.stale_completions += len(result.stale)
        return result

    @staticmethod
    async def _complete_rows(
        fetch_on: Callable[..., Awaitable[list[Any]]], params: Mapping[str, Any]
    ) -> list[Any]:
        """COMPLETE_BATCH's rows (``_COMPLETED_FIELDS``), through ``fetch_on``: the
        connection of its own, or the transaction's (:func:`poller.store.db.fetch`); the
        rows someone else held come back with status ``busy``."""
        return await fetch_on(queries.COMPLETE_BATCH, params, columns=_COMPLETED_FIELDS)

    def _carry_busy(self, outcomes: Sequence[Outcome], rows: list[Any]) -> set[int]:
        """Keep the outcomes whose row was busy for the next call, take their rows out of
        ``rows``; returns their ids."""
        busy = {row[0] for row in rows if row[2] == "busy"}
        if busy:
            rows[:] = [row for row in rows if row[2] != "busy"]
        self._carried_outcomes = {o.message_id: o for o in outcomes if o.message_id in busy}
        if busy and not self._busy_outage:
            log.warning(
                "%d outcomes wait for rows someone else holds locked (an open transaction "
                "on poller_outbox, or for an instant another poller's claim: a row it "
                "locked, re-checked and passed over stays locked until it commits): "
                "written when the lock goes, others go on: %s",
                len(busy),
                sorted(busy)[:10],
            )
        self._busy_outage = bool(busy)
        return busy

    def _follow_ups(self, outcomes: Sequence[Outcome], rows: Sequence[Any]) -> _FollowUps:
        """What follows from COMPLETE_BATCH's rows, with what earlier calls carried."""
        signals = health_signals(outcomes, {row[0]: row[1] for row in rows})
        judge = judging_due(signals, {row[1]: row[4] for row in rows}, any(r[5] for r in rows))
        if self._carried_signals:  # older: the new ones fold into copies of them (the
            judge = True  # carried ones stay as they are until the follow-ups commit)
            merged = {e: dataclasses.replace(s) for e, s in self._carried_signals.items()}
            for endpoint_id, signal in signals.items():
                if endpoint_id in merged:
                    merged[endpoint_id].add(signal)
                else:
                    merged[endpoint_id] = signal
            signals = merged
        heads = {row[0] for row in rows if row[3] is not None and row[2] in ENDED}
        failed = [row[0] for row in rows if row[2] == "failed"]
        return _FollowUps(signals, judge, sorted(heads | self._carried_heads), failed)

    async def _follow_up(
        self, conn: Any, work: _FollowUps
    ) -> tuple[HandOver, list[OperationalEvent], list[dict[str, Any]]]:
        transitions = await self._judge(conn, work.signals) if work.judge else []
        # No NOTIFY: a key's next message is in the same bucket, so this poller
        # claims it — the caller wakes its own claimer (``promoted``).
        handed = await hand_on(conn, work.heads, notify=False)
        events = await self.events.record(conn, transitions, work.failed)
        return handed, events, transitions

    def _followed_up(self, handed: HandOver) -> None:
        """The follow-ups committed: carry only the keys that were busy."""
        self._carried_heads = set(handed.busy)
        self._carried_signals = {}

    async def _follow_up_apart(
        self, work: _FollowUps
    ) -> tuple[HandOver, list[OperationalEvent], list[dict[str, Any]]]:
        """The follow-ups of rows already written, in a transaction of their own."""
        if not (work.judge or work.heads or work.failed):
            return HandOver(), [], []
        try:
            async with self.engine.begin() as conn:
                done = await self._follow_up(conn, work)
        except Exception as exc:
            if is_transient(exc):  # for the next call, which an idle completer makes soon
                self._carried_signals = work.signals if work.judge else {}
                self._carried_heads = set(work.heads)
                self._follow_up_outage.failed(exc)
            else:
                log.error("a completion's follow-ups failed; dropped: %s", exc, exc_info=exc)
                self._followed_up(HandOver())
            return HandOver(), [], []
        self._follow_up_outage.recovered()
        self._followed_up(done[0])
        return done

    async def _judge(self, conn: Any, signals: Mapping[int, Signal]) -> list[dict[str, Any]]:
        params = {"signals": signals_json(signals), **self._health_params}
        (judged,) = await fetch(conn, queries.JUDGE_HEALTH, params)
        return list(judged.events or [])

    @property
    def carried(self) -> int:
        """Follow-ups left for the next completion (key hand-overs whose rows were busy,
        health signals the database was away for): the completer makes one soon even
        with no outcome to write."""
        return len(self._carried_heads) + len(self._carried_signals) + len(self._carried_outcomes)

    @property
    def carried_outcomes(self) -> int:
        """Outcomes whose row someone else held locked, written again by the next call."""
        return len(self._carried_outcomes)

    async def reclaim_expired(self, limit: int = 1000) -> ReclaimResult:
        """Return expired claims to pending + needs_lookup (or failed at max attempts).

        The keys of reclaimed heads that failed are handed on without waiting;
        the rest (and any a stopped poller left) by :meth:`sweep_follow_ups`."""
        async with self.engine.begin() as conn:
            rows = (await conn.execute(queries.RECLAIM_EXPIRED, {"limit": limit})).all()
            failed = [row.id for row in rows if row.status == "failed"]
            await hand_on(conn, failed)
            events = await self.events.record(conn, failed=failed)
        result = ReclaimResult(events=events)
        for row in rows:
            (result.failed if row.status == "failed" else result.pending).append(row.id)
        return result

    async def sweep_follow_ups(self, *, keys: bool = True) -> int:
        """Maintenance: fold the health backlog (signals of endpoints whose rows were busy)
        in, and — with ``keys`` — hand on the keys whose head ended but that nobody handed
        on; returns how many keys."""
        async with self.engine.begin() as conn:
            transitions = await self._judge(conn, {})
            events = await self.events.record(conn, transitions)
            handed = await hand_on_ended(conn) if keys else 0
        self.events.notify(events)
        return handed
