"""The poller service (``poller run``): claim, deliver, complete — and stop cleanly.

One asyncio process, a few supervised tasks in a TaskGroup (one dying stops
the poller loudly):

* **claimer** — claims batches (CLAIM_BATCH, fair per endpoint) while there is room under
  ``concurrency`` and each endpoint's ``max_in_flight``; starts one delivery
  task per claimed message; when a claim comes back short it sleeps until a
  NOTIFY wake-up, freed capacity, the poll interval or the stop signal,
  whichever comes first.
* **listener** — LISTEN ``poller_outbox`` on its own connection, waking the
  claimer when a message for one of its buckets commits (``POLLER_NOTIFY=off``
  for PgBouncer transaction pooling: then it only polls).
* **completer** — writes outcomes in batches (one fenced statement each),
  shielded from cancellation, retried through database outages.
* **sweeper** — runs the maintenance services (poller/maintenance.py: reclaim
  expired claims, purge by retention) every ``sweep_interval`` (jittered)
  while this poller holds the maintenance lease.

What to claim is asked of ``scope()`` before every claim — the seam the shard
manager plugs into (poller/shards.py): which buckets, under which shard
fences, and whether to run maintenance. Without one, everything.

Shutdown (first SIGTERM/SIGINT): stop claiming, give in-flight deliveries
``shutdown_grace`` seconds, hand back the rest without counting the attempt
(marked ``needs_lookup`` when a send was cut off mid-way), write every
outcome, exit 0. A second signal exits at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import psycopg
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    stop_after_delay,
    stop_never,
    wait_exponential,
)

from poller import __version__, delivery, metrics, queries
from poller.claims import ClaimedMessage, Claims, Outcome, released
from poller.db import libpq_url
from poller.delivery import LookupAnswer, Verdict
from poller.election import Elector, make_elector
from poller.endpoints import Endpoint
from poller.maintenance import GaugeRefresher, Purger, Reclaimer
from poller.ops import serving
from poller.schema import NOTIFY_CHANNEL
from poller.senders import Sender
from poller.settings import Settings
from poller.shards import ClaimScope, ShardManager, check_shard_count

log = logging.getLogger("poller.service")

TRANSIENT = (DBAPIError, psycopg.OperationalError, OSError)
ENDPOINT_REFRESH = 5.0
UNSCOPED = ClaimScope(None, None, 1, maintenance=True)  # no election: everything
COMPLETION_LINGER = 0.005


@dataclass
class ServiceStats:
    """Counters for the demo, tests and (later) metrics."""

    claimed: int = 0
    outcomes: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    lookups: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    stale_completions: int = 0
    released: int = 0
    reclaimed: int = 0
    db_errors: int = 0


class Poller:
    def __init__(
        self,
        settings: Settings,
        *,
        engine: AsyncEngine,
        sender: Sender,
        database_url: str,
        poller_id: str,
        scope: Callable[[], ClaimScope] = lambda: UNSCOPED,
        on_refused: Callable[[list[int]], None] | None = None,
    ) -> None:
        self.settings = settings
        self.engine = engine
        self.sender = sender
        self.database_url = database_url
        self.poller_id = poller_id
        self.scope = scope
        self.on_refused = on_refused
        self.claims = Claims(engine, poller_id=poller_id, claim_lease=settings.claim_lease)
        self.maintenance: list[Reclaimer | Purger | GaugeRefresher] = [
            Reclaimer(self.claims),
            GaugeRefresher(engine),
            Purger(
                engine,
                delivered_age=settings.retention_delivered,
                failed_age=settings.retention_failed,
            ),
        ]
        self.stats = ServiceStats()
        self.shards: ShardManager | None = None  # set by serve(), for stats and tests
        self.user_agent = f"webhook-poller/{__version__}"
        self._endpoints: dict[int, Endpoint] = {}
        self._endpoints_at = 0.0
        self._in_flight: dict[int, int] = defaultdict(int)  # endpoint id -> deliveries
        self._tasks: dict[asyncio.Task[None], ClaimedMessage] = {}
        self._sending: set[int] = set()  # message ids whose request may be on the wire
        self._wake = asyncio.Event()
        self._completions: asyncio.Queue[Outcome] = asyncio.Queue()
        self._stopping = asyncio.Event()
        self._completer_done = asyncio.Event()

    def _retrying(self, give_up_after: float | None = None) -> AsyncRetrying:
        """Retry transient database errors with backoff (forever, or ``give_up_after`` s)."""

        def log_retry(state: RetryCallState) -> None:
            self.stats.db_errors += 1
            metrics.DB_ERRORS.inc()
            error = state.outcome.exception() if state.outcome else None
            log.warning("database unavailable, retrying: %s", error)

        return AsyncRetrying(
            retry=retry_if_exception_type(TRANSIENT),
            wait=wait_exponential(multiplier=0.1, max=5),
            stop=stop_never if give_up_after is None else stop_after_delay(give_up_after),
            before_sleep=log_retry,
            reraise=True,
        )

    # -- lifecycle ------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Run until ``stop`` is set, then shut down gracefully and return."""
        await self._refresh_endpoints(force=True)
        async with asyncio.TaskGroup() as group:
            completer = group.create_task(self._complete_loop(), name="completer")
            side = [group.create_task(self._sweep_loop(), name="sweeper")]
            if self.settings.notify:
                side.append(group.create_task(self._listen_loop(), name="listener"))
            claimer = group.create_task(self._claim_loop(), name="claimer")
            stopper = group.create_task(self._watch(stop), name="stop-watch")
            await stopper
            await claimer
            await self._drain()
            for task in side:
                task.cancel()
            await self._completions.join()
            completer.cancel()
        log.info("poller %s stopped", self.poller_id)

    async def _watch(self, stop: asyncio.Event) -> None:
        await stop.wait()
        self._stopping.set()
        self._wake.set()

    async def _drain(self) -> None:
        """Let in-flight deliveries finish up to the grace period; release the rest."""
        pending = set(self._tasks)
        if pending:
            log.info(
                "waiting up to %.1fs for %d deliveries", self.settings.shutdown_grace, len(pending)
            )
            _, pending = await asyncio.wait(pending, timeout=self.settings.shutdown_grace)
        for task in pending:
            msg = self._tasks[task]
            task.cancel()
            maybe_sent = msg.id in self._sending
            self._completions.put_nowait(released(msg, maybe_sent=maybe_sent))
            self.stats.released += 1
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)

    # -- claiming -------------------------------------------------------------

    def _room(self) -> int:
        return self.settings.concurrency - len(self._tasks)

    async def _claim_loop(self) -> None:
        # Claim in batches: with deliveries in flight, wait until a quarter of the
        # capacity is free rather than claiming one row per finished delivery.
        low_water = max(1, min(self.settings.batch_size, self.settings.concurrency) // 4)
        while not self._stopping.is_set():
            self._wake.clear()
            room = min(self._room(), self.settings.batch_size)
            if 0 < room < low_water and self._tasks:
                await self._sleep(self.settings.poll_interval)
                continue
            claimed: list[ClaimedMessage] = []
            if room > 0:
                try:
                    claimed = await self._claim(room)
                except TRANSIENT as exc:
                    self.stats.db_errors += 1
                    metrics.DB_ERRORS.inc()
                    log.warning("claim failed, retrying: %s", exc)
                    await self._sleep(min(self.settings.poll_interval, 1.0))
                    continue
            for msg in claimed:
                self._start(msg)
            if len(claimed) < room or room <= 0:
                await self._sleep(self.settings.poll_interval)

    async def _claim(self, limit: int) -> list[ClaimedMessage]:
        await self._refresh_endpoints()
        scope = self.scope()
        claimed = await self.claims.claim_batch(
            limit,
            scope.buckets,
            in_flight=dict(self._in_flight),
            default_max_in_flight=self.settings.max_in_flight,
            fences=scope.fences,
            shards=scope.shards,
            on_refused=self.on_refused,
        )
        self.stats.claimed += len(claimed)
        metrics.CLAIMED.inc(len(claimed))
        if claimed:
            log.debug("claimed %d messages", len(claimed), extra={"claimed": len(claimed)})
        if any(self._stale_endpoint(m) for m in claimed):
            await self._refresh_endpoints(force=True)  # changed since we cached it
        return claimed

    def _stale_endpoint(self, msg: ClaimedMessage) -> bool:
        cached = self._endpoints.get(msg.endpoint_id)
        return cached is None or cached.updated_at < msg.endpoint_updated_at

    async def _sleep(self, seconds: float) -> None:
        """Until a wake-up (NOTIFY, freed room, stop) or ``seconds`` pass."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._wake.wait()

    def _start(self, msg: ClaimedMessage) -> None:
        self._in_flight[msg.endpoint_id] += 1
        task = asyncio.create_task(self._deliver(msg), name=f"deliver-{msg.id}")
        self._tasks[task] = msg
        task.add_done_callback(self._finished)
        metrics.IN_FLIGHT.set(len(self._tasks))

    def _finished(self, task: asyncio.Task[None]) -> None:
        msg = self._tasks.pop(task)
        self._sending.discard(msg.id)
        self._in_flight[msg.endpoint_id] -= 1
        if not self._in_flight[msg.endpoint_id]:
            del self._in_flight[msg.endpoint_id]
        if not task.cancelled() and task.exception() is not None:
            log.error("delivery of message %d crashed", msg.id, exc_info=task.exception())
            self._completions.put_nowait(released(msg, maybe_sent=True))
        metrics.IN_FLIGHT.set(len(self._tasks))
        self._wake.set()  # room freed: claim more

    # -- delivering -----------------------------------------------------------

    async def _deliver(self, msg: ClaimedMessage) -> None:
        endpoint = await self._endpoint(msg.endpoint_id)
        timeout = min(
            endpoint.timeout or self.settings.request_timeout, self.settings.request_timeout
        )
        if msg.needs_lookup and endpoint.lookup_url:
            answer, attempt = await delivery.lookup(
                self.sender, endpoint, msg, timeout=timeout, user_agent=self.user_agent
            )
            self.stats.lookups[answer.value] += 1
            metrics.LOOKUPS.labels(answer.value).inc()
            self._observe("lookup", endpoint, attempt)
            if answer is not LookupAnswer.NOT_FOUND:
                self._record(delivery.lookup_outcome(msg, attempt, self.settings), msg, endpoint)
                return
        self._sending.add(msg.id)
        attempt = await delivery.send(
            self.sender,
            endpoint,
            msg,
            timeout=timeout,
            user_agent=self.user_agent,
            permanent_statuses=self.settings.permanent_statuses,
        )
        self._observe("send", endpoint, attempt)
        if attempt.verdict is Verdict.GONE:
            await self._disable(endpoint, f"410 Gone from {endpoint.name}")
        self._record(delivery.to_outcome(msg, attempt, self.settings), msg, endpoint)

    def _observe(self, kind: str, endpoint: Endpoint, attempt: delivery.Attempt) -> None:
        metrics.ATTEMPTS.labels(kind).inc()
        metrics.DELIVERY_SECONDS.labels(endpoint.name).observe(attempt.duration_ms / 1000)

    def _record(self, outcome: Outcome, msg: ClaimedMessage, endpoint: Endpoint) -> None:
        self.stats.outcomes[outcome.outcome] += 1
        metrics.DELIVERY_OUTCOMES.labels(endpoint.name, outcome.outcome).inc()
        if outcome.status != "delivered":
            fields = {
                "message_id": msg.id,
                "key": msg.idempotency_key,
                "attempt": msg.attempts,
                "endpoint": endpoint.name,
                "outcome": outcome.outcome,
                "status_code": outcome.status_code,
                "error": outcome.error_message,
            }
            if outcome.status == "failed":
                log.warning(
                    "message %d failed for good: %s", msg.id, outcome.error_message, extra=fields
                )
            else:
                log.info(
                    "delivery of message %d failed (%s), retrying",
                    msg.id,
                    outcome.error_message or outcome.error_class,
                    extra=fields,
                )
        if outcome.status == "delivered":
            latency = (datetime.now(UTC) - msg.created_at).total_seconds()
            metrics.LATENCY_SECONDS.labels(endpoint.name).observe(max(0.0, latency))
        self._completions.put_nowait(outcome)

    async def _disable(self, endpoint: Endpoint, reason: str) -> None:
        log.warning("endpoint %s disabled: %s", endpoint.name, reason)
        async for attempt in self._retrying():
            with attempt:
                async with self.engine.begin() as conn:
                    await conn.execute(
                        queries.DISABLE_ENDPOINT, {"id": endpoint.id, "reason": reason}
                    )
        self._endpoints_at = 0.0  # reload: its rows are no longer claimed

    # -- completing -----------------------------------------------------------

    async def _complete_loop(self) -> None:
        limit = max(self.settings.batch_size, 100)
        while True:
            batch = [await self._completions.get()]
            await asyncio.sleep(COMPLETION_LINGER)  # let a burst gather into one statement
            while len(batch) < limit and not self._completions.empty():
                batch.append(self._completions.get_nowait())
            try:
                await asyncio.shield(self._write(batch))
            finally:
                for _ in batch:
                    self._completions.task_done()

    async def _write(self, batch: list[Outcome]) -> None:
        # Past the claim lease these writes would be fenced out anyway: the rows
        # are reclaimed (with needs_lookup) and delivered again.
        try:
            async for attempt in self._retrying(give_up_after=self.settings.claim_lease):
                with attempt:
                    result = await self.claims.complete(batch)
        except TRANSIENT as exc:
            log.error("dropped %d outcomes after retrying for the claim lease: %s", len(batch), exc)
            return
        if result.stale:
            self.stats.stale_completions += len(result.stale)
            metrics.STALE_COMPLETIONS.inc(len(result.stale))
            log.warning(
                "%d completions refused by the claim fence (claims had expired): %s",
                len(result.stale),
                result.stale[:10],
            )

    # -- side tasks -------------------------------------------------------------

    async def _sweep_loop(self) -> None:
        """Maintenance services, while this poller holds the maintenance lease."""
        while True:
            interval = self.settings.sweep_interval
            await asyncio.sleep(interval * random.uniform(0.8, 1.2))
            if not self.scope().maintenance:
                continue
            for service in self.maintenance:
                try:
                    if await service.run_once() and isinstance(service, Reclaimer):
                        self.stats.reclaimed = service.reclaimed
                        self._wake.set()
                except TRANSIENT as exc:
                    self.stats.db_errors += 1
                    metrics.DB_ERRORS.inc()
                    log.warning("%s failed, will retry: %s", type(service).__name__, exc)

    def in_flight_for_shard(self, shard: int) -> int:
        """Deliveries under way for messages of ``shard`` (a shard being handed over)."""
        shards = self.scope().shards
        return sum(1 for msg in self._tasks.values() if msg.bucket % shards == shard)

    async def _listen_loop(self) -> None:
        backoff = 0.1
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                    libpq_url(self.database_url), autocommit=True
                ) as conn:
                    await conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
                    backoff = 0.1
                    self._wake.set()  # anything committed while we were away
                    async for note in conn.notifies():
                        if self._wants(note.payload):
                            self._wake.set()
            except TRANSIENT as exc:
                log.warning("LISTEN connection lost, reconnecting: %s", exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)

    def _wants(self, payload: str) -> bool:
        buckets = self.scope().buckets
        return buckets is None or (payload.isdigit() and int(payload) in buckets)

    # -- endpoints --------------------------------------------------------------

    async def _refresh_endpoints(self, force: bool = False) -> None:
        if not force and time.monotonic() - self._endpoints_at < ENDPOINT_REFRESH:
            return
        async with self.engine.connect() as conn:
            rows = (await conn.execute(queries.ALL_ENDPOINTS)).all()
        self._endpoints = {row.id: Endpoint.from_row(row) for row in rows}
        self._endpoints_at = time.monotonic()

    async def _endpoint(self, endpoint_id: int) -> Endpoint:
        if endpoint_id not in self._endpoints:
            async for attempt in self._retrying():
                with attempt:
                    await self._refresh_endpoints(force=True)
        return self._endpoints[endpoint_id]


async def serve(
    settings: Settings,
    *,
    engine: AsyncEngine,
    sender: Sender,
    database_url: str,
    poller_id: str,
    stop: asyncio.Event,
    elector: Elector | None = None,
    ready: asyncio.Future[Poller] | None = None,
) -> Poller:
    """A whole poller: shard leadership, claiming and delivering, until ``stop``.

    Leases are taken before the first claim and given up only after the last
    delivery has been written (graceful stop), so shards pass straight on.
    ``ready`` receives the Poller once it runs (tests and the demo watch it).
    """
    await check_shard_count(engine, settings.shards)
    elector = elector or make_elector(
        settings.election_backend, owner=poller_id, engine=engine, redis_url=settings.redis_url
    )
    holder: list[Poller] = []
    manager = ShardManager(
        elector,
        engine,
        shards=settings.shards,
        lease_ttl=settings.lease_ttl,
        fail_open=settings.election_fail == "open",
        in_flight=lambda shard: holder[0].in_flight_for_shard(shard) if holder else 0,
    )
    poller = Poller(
        settings,
        engine=engine,
        sender=sender,
        database_url=database_url,
        poller_id=poller_id,
        scope=manager.scope,
        on_refused=manager.refused,
    )
    holder.append(poller)
    poller.shards = manager
    await manager.tick()
    manager_stop = asyncio.Event()
    leadership = asyncio.create_task(manager.run(manager_stop), name="shard-manager")
    if ready is not None:
        ready.set_result(poller)
    try:
        async with serving(settings.metrics_addr, engine):
            await poller.run(stop)
    finally:
        manager_stop.set()
        await leadership
        await manager.stop()
        await elector.close()
    return poller
