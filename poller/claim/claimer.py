"""Claiming: when to claim, how much, and what to do with a committed claim.

The claim loop claims batches (``Claims.claim``: fair per endpoint, fenced per
shard) while there is room under ``concurrency`` and each endpoint's
``max_in_flight``. When a claim comes back short it sleeps until a NOTIFY
wake-up, freed room, the poll interval or the stop, whichever comes first.

**Nothing is dropped after a claim commits.** The claim is one statement
(``Claims.claim``); the endpoints its messages need and the cache lacks are
read right after it, and if that read fails those messages are handed back
unsent (``outcomes.released``: the attempt refunded) before the error is
handled like any failed claim. From there to the last ``Dispatcher.start``
there is no I/O and no ``await``, so every claimed row reaches a send or an
explicit release.

The listener LISTENs on its own connection and wakes the claim loop when a
message for one of its buckets commits (``POLLER_NOTIFY=off`` for PgBouncer
transaction pooling: then the loop only polls).

``on_cycle`` callbacks receive the number of messages each claim cycle took
(tests wait on them instead of sleeping; the demo could count them).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import psycopg

from poller.claim.shards import ClaimScope
from poller.complete.completer import Completer
from poller.deliver.dispatcher import Dispatcher, EndpointCache
from poller.observe import metrics
from poller.observe.logs import OutageLog
from poller.rows.claims import ClaimBatch, Claims
from poller.rules import outcomes
from poller.rules.health import GOVERN_IDLE_INTERVAL, GOVERN_INTERVAL, GOVERN_QUIET
from poller.settings import Settings
from poller.store.db import is_transient, libpq_url
from poller.store.schema import NOTIFY_CHANNEL

if TYPE_CHECKING:
    from poller.observe.otel import Telemetry

log = logging.getLogger("poller.claim.claimer")

LISTEN_BACKOFF_MAX = 5.0
FULL = 2**30  # what an endpoint shown full to the claim holds (Claimer._in_flight)


class Claimer:
    def __init__(
        self,
        settings: Settings,
        claims: Claims,
        dispatcher: Dispatcher,
        completer: Completer,
        endpoints: EndpointCache,
        *,
        scope: Callable[[], ClaimScope],
        on_refused: Callable[[list[int]], None] | None = None,
        telemetry: Telemetry | None = None,
    ) -> None:
        self.settings = settings
        self.telemetry = telemetry  # a span per claim batch (poller/observe/otel.py); None: off
        self.claims = claims
        self.dispatcher = dispatcher
        self.completer = completer
        self.endpoints = endpoints
        self.scope = scope
        self.on_refused = on_refused
        self.on_cycle: list[Callable[[int], object]] = []
        self.cycles = 0  # claim cycles run (each calls on_cycle with what it claimed)
        self.wake = asyncio.Event()
        self.listening = False  # LISTEN is on: a commit's NOTIFY wakes the loop
        self._governed_last = -GOVERN_INTERVAL  # monotonic time of the last governed claim
        self._governed_busy = False  # it found governed endpoints with due messages
        # NOTIFYs for a bucket of a cached rate-limited endpoint: counted, and the count
        # the last governed claim started after (_govern_every)
        self._limited_notes = 1  # from the start: anything may have been committed
        self._limited_seen = 0
        # Messages of rate-limited endpoints governed claims took (id -> ordered), until
        # their outcomes are written: what comes due after them no NOTIFY announces
        self._limited_out: dict[int, bool] = {}
        # Messages past max_age governed claims took, until the first governed claim
        # after their outcomes were written (_govern_every)
        self._aged: set[int] = set()
        # The last claim took less than it asked for while no endpoint was at its cap:
        # nothing else was due, so freed room is no reason to claim (room_freed)
        self._drained = False
        # A NOTIFY came since the last claim: new work, worth a claim of any room (a
        # message committed for an endpoint that holds nothing must not wait for a
        # quarter of the capacity to free)
        self._news = False
        self._news_bucket: int | None = None  # the first NOTIFY's bucket since the last claim
        self._outage = OutageLog("claiming")

    @property
    def low_water(self) -> int:
        """Room worth a claim while deliveries are in flight: a quarter of the capacity,
        rather than a claim per finished delivery."""
        return max(1, min(self.settings.batch_size, self.settings.concurrency) // 4)

    def room_freed(self) -> None:
        """A delivery finished: wake the loop once there is room worth a claim (waking
        it for each one cost a task switch and a timer per delivery, to sleep again) —
        unless the last claim found nothing more due. Then what makes messages due
        wakes it instead: a NOTIFY, a key handed on, a claim handed back or reclaimed,
        the poll interval (a retry's time, a shard won). At 3,000 messages/s in
        transactions of 10, more than half the claims came back empty. Messages past
        max_age that a governed claim took are the exception: their outcomes' writes
        may free room for more of them (:meth:`_govern_every`)."""
        if self.wake.is_set() or (self._drained and not self._aged):
            return  # set: the loop is on its way, and reads the room itself
        dispatcher = self.dispatcher
        if not dispatcher.tasks or min(dispatcher.room, self.settings.batch_size) >= self.low_water:
            self.wake.set()

    def _capped(self) -> bool:
        """Some endpoint holds as many deliveries as it may: its due messages wait for
        room (Claims.claim gives each endpoint its max_in_flight less what it holds)."""
        default = self.settings.max_in_flight
        for endpoint_id, held in self.dispatcher.in_flight.items():
            endpoint = self.endpoints.get(endpoint_id)
            cap = endpoint.max_in_flight if endpoint is not None else None
            if held >= (cap or default):
                return True
        return False

    async def run(self, stopping: asyncio.Event) -> None:
        settings = self.settings
        low_water = self.low_water
        backoff = 0.1
        while not stopping.is_set():
            self.wake.clear()
            room = min(self.dispatcher.room, settings.batch_size)
            if 0 < room < low_water and self.dispatcher.tasks and not self._news:
                await self._sleep(self._until_room(settings.poll_interval))
                continue
            self._news = False
            claimed = 0
            if room > 0:
                try:
                    claimed = await self._claim(room)
                except Exception as exc:
                    if not is_transient(exc):
                        raise
                    self._outage.failed(exc)
                    await self._sleep(backoff)
                    backoff = min(backoff * 2, settings.poll_interval, 5.0)
                    continue
                backoff = 0.1
                self._outage.recovered()
            self.cycles += 1
            for callback in self.on_cycle:
                callback(claimed)
            if room <= 0:  # no room: until a wake-up, or a delivery at work starts waiting
                await self._sleep(self._until_room(self._idle_for()))
            elif claimed < room:  # it took all that was due: more room would find nothing
                await self._sleep(self._idle_for())

    def _until_room(self, seconds: float) -> float:
        """``seconds``, or less when a delivery at work starts waiting sooner (its room
        is free then: Dispatcher.room)."""
        waits_in = self.dispatcher.waits_in()
        return seconds if waits_in is None else min(seconds, waits_in)

    def _idle_for(self) -> float:
        """How long to wait for a wake-up: the poll interval, or less while governed
        endpoints (rate limited, probing) have due messages that wait for their turn, or
        may have (a NOTIFY for a rate-limited endpoint's bucket came since the last
        governed claim began)."""
        if not (self._governed_busy or self._limited_noted()):
            return self.settings.poll_interval
        wait = self._governed_last + GOVERN_INTERVAL - time.monotonic()
        return min(self.settings.poll_interval, max(wait, 0.0))

    def _govern_every(self, now: float) -> float:
        """Seconds between governed claims: GOVERN_INTERVAL while there may be governed
        work (the last one found some, a request failed within GOVERN_QUIET seconds, or
        a NOTIFY came for the bucket of a cached rate-limited endpoint since the last
        one began, or a message of such an endpoint came due without one: see
        :meth:`written` — without NOTIFY, a cached rate-limited endpoint is enough),
        else GOVERN_IDLE_INTERVAL. Ten a second for as long as a cached endpoint was
        rate limited made a busy poller walk its idle rate-limited endpoints ten times
        a second with nothing to take (1,000 of them: 11 ms of PostgreSQL a claim, on
        the claim cycle it preceded). And none once
        the outcome of a message past max_age that one took is written: the messages
        after it may be past max_age too (an ordered key's next message is due once
        the one before has failed: the claim its hand-over wakes takes it; a backlog's
        next, in the room its outcomes freed). At ten governed claims a second, an
        ordered key's aged messages went ten a second, and no probe could go while
        they were all that was due."""
        if self._aged:
            held = self.completer.held
            if any(msg_id not in held for msg_id in self._aged):
                return 0.0
        if (
            self._governed_busy
            or now - self.dispatcher.failed_at < GOVERN_QUIET
            or self._limited_noted()
            or (self.endpoints.rate_limited and not self.listening)
        ):
            return GOVERN_INTERVAL
        return GOVERN_IDLE_INTERVAL

    def _limited_noted(self) -> bool:
        """Since the last governed claim began, a NOTIFY came for the bucket of a cached
        rate-limited endpoint (or LISTEN reconnected, or a message of such an endpoint
        came due: :meth:`written`), and some cached endpoint is rate limited: its
        message may be due."""
        return bool(self.endpoints.rate_limited) and self._limited_notes != self._limited_seen

    def written(self, batch: Sequence[outcomes.Outcome]) -> None:
        """Outcomes were written. For a rate-limited endpoint's message a governed claim
        took, what is due now after it is announced by no NOTIFY, and only a governed
        claim takes it: its key's next message, once it has ended, or itself, handed
        back. Counted like a NOTIFY for its bucket: at the idle cadence each waited up to
        a second (a key whose receiver took 0.15 s went one message a second). A retry
        needs nothing of this: it follows a failed request, after which the poller
        governs often for GOVERN_QUIET seconds."""
        if not self._limited_out:
            return
        for outcome in batch:
            ordered = self._limited_out.pop(outcome.message_id, None)
            if ordered is None:
                continue
            if outcome.status != "pending":
                self._limited_notes += ordered  # the key's next message is due now
            elif not outcome.retry_delay:
                self._limited_notes += 1  # handed back: due now

    def reclaimed(self) -> None:
        """Rows were reclaimed: due now, and a rate-limited endpoint's among them only a
        governed claim takes."""
        self._limited_notes += 1
        self.wake.set()

    async def _claim(self, limit: int) -> int:
        self._drained = False  # until this claim says otherwise
        scope = self.scope()
        asked = time.monotonic()  # the lease runs from the claim, at the latest from here
        asked_ns = time.time_ns()
        # Rate-limited endpoints and open circuits' probes (poller/rules/health.py): at most
        # ten times a second while there may be such work, else once a second.
        governed = asked - self._governed_last >= self._govern_every(asked)
        notes = self._limited_notes  # what this governed claim answers, if it is one
        batch = await self.claims.claim(
            limit,
            scope.buckets,
            in_flight=self._in_flight(),
            full_tenants=self._full_tenants(),
            first_bucket=self._take_news_bucket(),
            default_max_in_flight=self.settings.max_in_flight,
            fences=scope.fences,
            shards=scope.shards,
            on_refused=self.on_refused,
            endpoint_versions=self.endpoints.versions,
            governed=governed,
        )
        metrics.CLAIM_SECONDS.observe(time.monotonic() - asked)
        # Committed: from here to the last start, no I/O and no await.
        self.endpoints.update(batch.endpoints)
        if batch.governed is not None:
            self._governed_claimed(batch, asked, notes)
        if batch.unready:  # claimed, but their endpoints could not be read: back, unsent
            log.warning(
                "%d claimed messages handed back unsent: their endpoints could not be read",
                len(batch.unready),
            )
            for msg in batch.unready:
                self.completer.hold(msg, claimed_at=asked)
                self.completer.put(outcomes.released(msg))
        if batch.error is not None:
            raise batch.error
        for msg in batch.messages:
            self.completer.hold(msg, claimed_at=asked)
            self.dispatcher.start(msg, asked)
        if batch.messages:
            metrics.CLAIMED.inc(len(batch.messages))
            if self.telemetry is not None:
                parents = [m.traceparent for m in batch.messages if m.traceparent]
                self.telemetry.batch("claim", asked_ns, parents)
            if governed and (probes := sum(1 for m in batch.messages if m.probe)):
                metrics.CIRCUIT_PROBES.inc(probes)
                log.info("claimed %d probe message(s) for open circuits", probes)
            if governed and (aged := sum(1 for m in batch.messages if m.expired)):
                log.info(
                    "claimed %d message(s) past max_age, to fail unsent (no probe, no token)", aged
                )
            log.debug("claimed %d messages", len(batch.messages))
        self._drained = len(batch.messages) < limit and not self._capped()
        return len(batch.messages)

    def _take_news_bucket(self) -> int | None:
        bucket, self._news_bucket = self._news_bucket, None
        return bucket

    def _in_flight(self) -> dict[int, int]:
        """What this poller holds per endpoint, for the claim's per-endpoint room. Near
        POLLER_MAX_WAITING, an endpoint with a delivery waiting for its answer is shown
        full: slow receivers get no more, fast ones keep their room."""
        dispatcher = self.dispatcher
        held = dict(dispatcher.in_flight)
        if dispatcher.near_ceiling:
            for endpoint_id in dispatcher.slow_endpoints():
                held[endpoint_id] = FULL
        return held

    def _full_tenants(self) -> list[str]:
        """The tenants holding POLLER_TENANT_MAX_IN_FLIGHT deliveries or more here: their
        endpoints get none in this claim."""
        ceiling = self.settings.tenant_max_in_flight
        if not ceiling or len(self.dispatcher.tasks) < ceiling:
            return []
        held: Counter[str] = Counter()
        endpoints = self.endpoints
        for endpoint_id, n in self.dispatcher.in_flight.items():
            endpoint = endpoints.get(endpoint_id)
            if endpoint is not None and endpoint.tenant is not None:
                held[endpoint.tenant] += n
        return [tenant for tenant, n in held.items() if n >= ceiling]

    def _governed_claimed(self, batch: ClaimBatch, asked: float, notes: int) -> None:
        """A governed claim (begun at ``asked``, after ``notes``) committed ``batch``."""
        self._governed_last = asked
        self._limited_seen = notes
        self._governed_busy = bool(batch.governed)
        held = self.completer.held
        self._aged = {i for i in self._aged if i in held}
        self._aged.update(m.id for m in batch.messages if m.expired)
        if limited := self.endpoints.rate_limited:
            for msg in batch.messages:
                if msg.endpoint_id in limited and not msg.expired:
                    self._limited_out[msg.id] = msg.ordering_key is not None

    async def _sleep(self, seconds: float) -> None:
        """Until a wake-up (NOTIFY, freed room, stop) or ``seconds`` pass."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self.wake.wait()

    # -- LISTEN ---------------------------------------------------------------------

    async def listen(self, database_url: str) -> None:
        """Wake the claim loop on NOTIFY for our buckets; reconnect with backoff."""
        backoff = 0.1
        outage = OutageLog("LISTEN connection")
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                    libpq_url(database_url), autocommit=True
                ) as conn:
                    await conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
                    backoff = 0.1
                    outage.recovered()
                    self.listening = True
                    self.wake.set()  # anything committed while we were away
                    self._limited_notes += 1
                    # aclosing: an error inside the loop must close the generator (which
                    # holds the connection's lock) before the connection is closed.
                    async with contextlib.aclosing(conn.notifies()) as notes:
                        async for note in notes:
                            self._notified(note.payload)
            except Exception as exc:
                self.listening = False
                if not is_transient(exc):
                    raise
                outage.failed(exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, LISTEN_BACKOFF_MAX)

    def _notified(self, payload: str) -> None:
        """A NOTIFY: for one of our buckets, wake the loop, and count it if a cached
        endpoint of that bucket is rate limited (_govern_every)."""
        if self._wants(payload):
            self._news = True
            self.wake.set()
            bucket = _bucket(payload)
            if self._news_bucket is None:
                self._news_bucket = bucket
            if bucket is not None and self.endpoints.rate_limited_in(bucket):
                self._limited_notes += 1

    def _wants(self, payload: str) -> bool:
        buckets = self.scope().buckets
        return buckets is None or _bucket(payload) in buckets


def _bucket(payload: str) -> int | None:
    """The bucket a NOTIFY names, or None: anyone who can NOTIFY on the channel writes
    its payload, and ``int()`` of a string of over 4,300 digits raises (it ended the
    listener, and with it the poller)."""
    if len(payload) <= 3 and payload.isascii() and payload.isdigit():
        return int(payload)
    return None
