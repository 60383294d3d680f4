"""Writing outcomes, and keeping the claims of rows still being worked on.

A claimed row is *held* by this poller from its claim until its outcome is
written (or fenced out): while it is delivered, and while its outcome waits in
the queue or is retried through a database outage.

* :meth:`Completer.run` writes queued outcomes in batches — one fenced
  statement each (``Completions.complete``), shielded from cancellation — and
  retries transient database errors with backoff **until the write lands**:
  an outcome is never dropped because it is late. A write from a claim that
  was taken over meanwhile is refused by the claim-token fence and counted
  (``stale_completions``). An outcome PostgreSQL refuses for its content (a
  non-transient error) is written again alone, then stripped to its verdict,
  so one bad outcome cannot block the others or crash the loop over and over.
* :meth:`Completer.extend_leases` is the claim-lease heartbeat: one
  statement, every ``claim_lease / 3`` seconds, extends the lease of every
  held row, fenced by claim token. So a slow send plus a slow write never
  outlives the lease of a poller that is alive; only a dead, frozen or
  partitioned poller's rows are reclaimed. A row the heartbeat finds taken
  over is dropped from the held set (its late outcome will be fenced out); one
  whose outcome's write committed meanwhile is not counted as taken.
* :meth:`Completer.can_start` says whether a lookup or send may start: only
  with its timeout plus :data:`LEASE_MARGIN` of lease left by this process's
  clock, so no request is on the wire while its row can be reclaimed.
* A completion never waits on a row someone else holds (poller/rows/completions.py); an
  ordering key an application's open transaction holds is left for later, and
  an idle completer comes back for it every :data:`CARRY_INTERVAL` seconds.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, wait_exponential

from poller.observe import metrics
from poller.observe.logs import OutageLog
from poller.rows.claims import Claims
from poller.rows.completions import CompletionResult
from poller.rules.outcomes import ClaimedMessage, Outcome
from poller.store.db import is_transient

if TYPE_CHECKING:
    from poller.observe.otel import Telemetry

log = logging.getLogger("poller.complete.completer")

LINGER = 0.005  # let a burst of outcomes gather into one statement
LEASE_MARGIN = 0.5
"""Seconds of claim lease a request must leave when it ends at its timeout: for the
reclaimer's clock, a paused event loop and the outcome's write to begin."""
CARRY_INTERVAL = 0.2
"""Seconds an idle completer waits before it retries what was busy (Completions.carried)."""


class Completer:
    def __init__(
        self,
        claims: Claims,
        *,
        batch_limit: int = 100,
        on_promoted: Callable[[], None] = lambda: None,
        on_written: Callable[[Sequence[Outcome]], None] = lambda _: None,
        telemetry: Telemetry | None = None,
    ) -> None:
        self.claims = claims
        self.telemetry = telemetry  # a span per completion batch (poller/observe/otel.py)
        self.traces: dict[int, str] = {}  # message id -> its traceparent, with telemetry on
        self.batch_limit = batch_limit
        # messages became due now (ordered ones promoted, claims handed back): claim them
        self.on_promoted = on_promoted
        self.on_written = on_written  # a batch was written (or refused): room again
        self.held: dict[int, int] = {}  # message id -> claim token
        # message id -> monotonic time until which its lease surely holds: the moment
        # before the claim or last heartbeat was asked for, plus the lease (which
        # PostgreSQL measured from a later moment, on its own clock)
        self.lease_until: dict[int, float] = {}
        # message id -> claim token of outcomes being written: a heartbeat that meets
        # one of their rows no longer in flight has met this very write, not a takeover
        self._writing: dict[int, int] = {}
        # A deque and two events, not an asyncio.Queue (its put, get and task_done
        # were eight Python calls a delivery): outcomes not yet taken into a write,
        # and how many were put and not yet written (those and the batch being written)
        self._waiting: deque[Outcome] = deque()
        self._arrived = asyncio.Event()  # set when _waiting stops being empty
        self._unwritten = 0
        self._all_written = asyncio.Event()  # set when _unwritten drops to 0
        self._outage = OutageLog("writing outcomes")

    # -- the held set --------------------------------------------------------------

    def hold(self, msg: ClaimedMessage, *, claimed_at: float | None = None) -> None:
        self.held[msg.id] = msg.claim_token
        if self.telemetry is not None and msg.traceparent is not None:
            self.traces[msg.id] = msg.traceparent
        start = time.monotonic() if claimed_at is None else claimed_at
        self.lease_until[msg.id] = start + self.claims.claim_lease

    def can_start(self, msg_id: int, timeout: float) -> bool:
        """Whether a request of up to ``timeout`` seconds may start for this claim: the
        lease, by this process's clock, must outlast it by :data:`LEASE_MARGIN`.

        Else the row could be reclaimed while the request is on the wire, and the
        next poller's lookup would not find what is still being processed — a
        duplicate, or for an ordered key the next message sent beside it. The
        heartbeat keeps a live poller's leases at least 2/3 full; this refuses
        only when it is late (the database unreachable) or the process was paused.
        """
        until = self.lease_until.get(msg_id)
        return (
            msg_id in self.held
            and until is not None
            and time.monotonic() + timeout + LEASE_MARGIN <= until
        )

    def _unhold(self, outcomes: Sequence[Outcome]) -> None:
        for o in outcomes:
            if self.held.get(o.message_id) == o.claim_token:
                del self.held[o.message_id]
                self.lease_until.pop(o.message_id, None)

    async def extend_leases(self) -> int:
        """The heartbeat: extend every held claim's lease; returns how many are still ours."""
        held = dict(self.held)
        if not held:
            return 0
        asked = time.monotonic()
        beat = await self.claims.extend(held)
        for msg_id in beat.extended:
            if self.held.get(msg_id) == held[msg_id]:
                self.lease_until[msg_id] = asked + self.claims.claim_lease
        # A row whose outcome is being written meanwhile is not extended (no longer in
        # flight) yet not lost: its write committed first and is about to unhold it; nor
        # is one whose write ended (unheld) while the statement was on its way. A row
        # someone else holds locked (busy) is still ours: its lease is not extended this
        # time, so no new request starts for it (can_start) until a beat extends it.
        lost = [
            msg_id
            for msg_id, token in held.items()
            if msg_id not in beat.extended
            and msg_id not in beat.busy
            and self.held.get(msg_id) == token
            and self._writing.get(msg_id) != token
        ]
        for msg_id in lost:
            del self.held[msg_id]
            self.lease_until.pop(msg_id, None)
        if lost:
            metrics.CLAIMS_LOST.inc(len(lost))
            log.warning(
                "%d claims were taken over before their outcome was written: %s",
                len(lost),
                lost[:10],
            )
        return len(beat.extended) + len(beat.busy)

    # -- outcomes ------------------------------------------------------------------

    def put(self, outcome: Outcome) -> None:
        waiting = self._waiting
        waiting.append(outcome)
        self._unwritten += 1
        if len(waiting) == 1:
            self._arrived.set()

    @property
    def queued(self) -> int:
        return len(self._waiting)

    async def flush(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for every queued outcome to be written (those whose
        row someone else holds locked too: the idle completer tries them again)."""
        try:
            async with asyncio.timeout(timeout):
                while self._unwritten or self.claims.completions.carried_outcomes:
                    self._all_written.clear()
                    await self._all_written.wait()
        except TimeoutError:
            return False
        return True

    async def _arrival(self) -> None:
        while not self._waiting:
            self._arrived.clear()
            await self._arrived.wait()

    async def run(self) -> None:
        waiting = self._waiting
        while True:
            if self.claims.completions.carried and not waiting:
                try:
                    async with asyncio.timeout(CARRY_INTERVAL):
                        await self._arrival()
                except TimeoutError:
                    await asyncio.shield(self._write([]))  # hand on what was busy
                    self._all_written.set()  # flush() looks again at what is carried
                    continue
            else:
                await self._arrival()
            await asyncio.sleep(LINGER)
            batch = [waiting.popleft() for _ in range(min(len(waiting), self.batch_limit))]
            try:
                await asyncio.shield(self._write(batch))
            finally:
                self._unwritten -= len(batch)
                if not self._unwritten:
                    self._all_written.set()

    async def _write(self, batch: list[Outcome]) -> None:
        began_ns = time.time_ns()
        self._writing.update((o.message_id, o.claim_token) for o in batch)
        try:
            try:
                result = await self._complete(batch)
            except Exception as exc:
                if is_transient(exc):
                    raise
                result = await self._write_apart(batch, exc)
            self._unhold(result.ended)
        finally:
            for o in batch:
                self._writing.pop(o.message_id, None)
        if self.telemetry is not None:
            parents = [self.traces.pop(o.message_id, "") for o in batch]
            self.telemetry.batch("complete", began_ns, [p for p in parents if p])
        # an outcome whose row someone holds stays held, and its room taken, until a
        # later write ends it (Completions carries it)
        self.on_written(result.ended)
        if result.promoted or any(
            o.status == "pending" and not o.retry_delay for o in result.ended
        ):
            self.on_promoted()
        if result.opened:
            metrics.CIRCUIT_OPENS.inc(result.opened)
        if result.events:
            self.claims.completions.events.notify(result.events)
        if result.stale:
            metrics.STALE_COMPLETIONS.inc(len(result.stale))
            log.warning(
                "%d completions refused by the claim fence (the claims were taken over): %s",
                len(result.stale),
                result.stale[:10],
            )

    async def _complete(self, batch: Sequence[Outcome]) -> CompletionResult:
        """One fenced write, retried through transient database errors until it lands:
        once at once (a connection a pooler dropped is opened again), then with
        backoff. The retry loop is set up only after the first try failed: per batch,
        tenacity's machinery cost about 1 % of the poller's loop."""
        try:
            result = await self.claims.complete(batch)
        except Exception as exc:
            if not is_transient(exc):
                raise
            self._outage.failed(exc)
        else:
            self._outage.recovered()
            return result

        def before_sleep(state: RetryCallState) -> None:
            error = state.outcome.exception() if state.outcome is not None else None
            if error is not None:
                self._outage.failed(error)

        async for attempt in AsyncRetrying(
            retry=retry_if_exception(is_transient),
            wait=wait_exponential(multiplier=0.1, max=5),
            before_sleep=before_sleep,
            reraise=True,
        ):
            with attempt:
                result = await self.claims.complete(batch)
        self._outage.recovered()
        return result

    async def _write_apart(self, batch: list[Outcome], error: Exception) -> CompletionResult:
        """A batch PostgreSQL refused for its content: each outcome alone, stripped if need be."""
        log.error("outcome batch refused (%s); writing its %d outcomes apart", error, len(batch))
        total = CompletionResult()
        for outcome in batch:
            try:
                result = await self._complete([outcome])
            except Exception as exc:
                if is_transient(exc):
                    raise
                stripped = dataclasses.replace(
                    outcome,
                    error_class="UnwritableOutcome",
                    error_message=f"outcome detail refused by the database: {type(exc).__name__}",
                    response_excerpt=None,
                )
                result = await self._complete([stripped])
            total.applied += result.applied
            total.stale += result.stale
            total.busy = result.busy  # each call carries the ones still busy
            total.ended += result.ended
            total.promoted += result.promoted
            total.events += result.events
            total.opened += result.opened
        return total
