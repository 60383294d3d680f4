"""The poller service (``poller run``): claim, deliver, complete — and stop cleanly.

One asyncio process; the parts follow the flow of a message, each in its own
module and each runnable (and testable) alone:

* **claimer** (poller/claim/claimer.py) — claims batches while there is room,
  woken by NOTIFY (its **listener**), freed room or the poll interval;
* **dispatcher** (poller/deliver/dispatcher.py) — one delivery task per claimed
  message: lookup, send, classify; a crash is a counted attempt;
* **completer** (poller/complete/completer.py) — writes outcomes in batches, shielded,
  until they land; its **lease keeper** extends the claims of rows still held;
* **maintenance** (poller/service/maintenance.py) — reclaim, purge, gauges, on a
  jittered interval while this poller holds the maintenance lease;
* **shard manager** (poller/claim/shards.py) — which shards this poller leads.

Every long-lived loop runs under a :class:`~poller.service.supervise.Supervisor`: the
first to crash makes ``/healthz`` unhealthy, stops the poller gracefully and
makes :func:`serve` raise ``ServiceCrashed`` (``poller run`` exits 70).

What to claim is asked of ``scope()`` before every claim — the seam the shard
manager plugs into: which buckets, under which shard fences, and whether to
run maintenance. Without one, everything.

Shutdown (first SIGTERM/SIGINT, or a crash): stop claiming, give in-flight
deliveries ``shutdown_grace`` seconds, hand back the rest (the attempt
refunded, a bounded number of times per message; marked ``needs_lookup`` when
a send was cut off mid-way), write every outcome, release the leases. A
second signal exits at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy.ext.asyncio import AsyncEngine

from poller.claim.claimer import Claimer
from poller.claim.shards import ClaimScope, ShardManager, check_cluster
from poller.complete.completer import Completer
from poller.deliver.dispatcher import Dispatcher, EndpointCache
from poller.deliver.wire import Sender
from poller.election import Elector, make_elector
from poller.endpoints.registry import Endpoint
from poller.errors import ConfigurationError
from poller.observe import metrics
from poller.observe.logs import OutageLog
from poller.rows.claims import Claims
from poller.rows.events import EventHook, EventSink
from poller.rules.keyring import Keyring
from poller.service.maintenance import Call, GaugeRefresher, Periodic, Purger, Reclaimer
from poller.service.ops import serving
from poller.service.supervise import Supervisor
from poller.settings import Settings
from poller.store import queries
from poller.store.db import is_transient
from poller.store.migrate import check_schema

if TYPE_CHECKING:
    from poller.observe.otel import Telemetry
    from poller.rules.outcomes import Outcome

log = logging.getLogger("poller.service.runner")

UNSCOPED = ClaimScope(None, None, 1, maintenance=True)  # no election: everything
FLUSH_AFTER_STOP = 30.0  # outcomes still unwritten this long after the drain are left to reclaim


class Poller:
    """One poller's parts, wired; :meth:`run` runs them under a supervisor until stopped."""

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
        supervisor: Supervisor | None = None,
        telemetry: Telemetry | None = None,
    ) -> None:
        self.settings = settings
        self.engine = engine
        self.database_url = database_url
        self.poller_id = poller_id
        self.scope = scope
        self.supervisor = supervisor or Supervisor()
        self.shards: ShardManager | None = None  # set by serve(), for the demo and tests
        self.ops_port: int | None = None  # where serve() put /metrics, /healthz, /readyz
        self.claims = Claims(
            engine,
            poller_id=poller_id,
            claim_lease=settings.claim_lease,
            keyring=settings.keyring,
            health=settings.health,
            events=EventSink(settings.operator_endpoint),
            follow_ups_apart=True,
        )
        # Operational events (poller/rows/events.py), in process: append callables taking one
        # OperationalEvent; they run after the change committed, and must not block.
        self.on_event: list[EventHook] = self.claims.completions.events.hooks
        self.completer = Completer(
            self.claims,
            batch_limit=max(settings.batch_size, 100),
            on_promoted=lambda: self._room_freed(),
            on_written=lambda batch: self._written(batch),
            telemetry=telemetry,
        )
        self.endpoints = EndpointCache()
        self.dispatcher = Dispatcher(
            settings,
            sender,
            self.endpoints,
            self.completer,
            on_room=lambda: self.claimer.room_freed(),
            telemetry=telemetry,
        )
        self.claimer = Claimer(
            settings,
            self.claims,
            self.dispatcher,
            self.completer,
            self.endpoints,
            scope=scope,
            on_refused=on_refused,
            telemetry=telemetry,
        )
        self.reclaimer = Reclaimer(self.claims.completions)
        maintenance = lambda: self.scope().maintenance  # noqa: E731 - read at each run
        self.periodic = [
            Periodic("lease-keeper", Call(self.completer.extend_leases), settings.claim_lease / 3),
            Periodic(
                "reclaimer",
                self.reclaimer,
                settings.sweep_interval,
                when=maintenance,
                after=self._reclaimed,
            ),
            Periodic("gauges", GaugeRefresher(engine), settings.sweep_interval, when=maintenance),
            Periodic(
                "purger",
                Purger(
                    engine,
                    delivered_age=settings.retention_delivered,
                    failed_age=settings.retention_failed,
                    keys_age=settings.retention_keys,
                    events_age=settings.retention_events,
                ),
                settings.sweep_interval,
                when=maintenance,
            ),
        ]

    def _room_freed(self) -> None:
        self.claimer.wake.set()

    def _written(self, batch: Sequence[Outcome]) -> None:
        self.dispatcher.written(batch)  # failed requests give their slots back
        self.claimer.written(batch)  # a rate-limited endpoint's next may be due
        self.claimer.room_freed()

    def _reclaimed(self, count: int) -> None:
        if count:
            self.claimer.reclaimed()  # reclaimed rows are due now

    def in_flight_for_shard(self, shard: int) -> int:
        return self.dispatcher.in_flight_for_shard(shard, self.scope().shards)

    async def run(self, stop: asyncio.Event) -> None:
        """Run until ``stop`` is set or a loop crashes, then shut down gracefully.

        Raises ServiceCrashed after the graceful part if a loop crashed.
        """
        sup = self.supervisor
        watcher = asyncio.create_task(self._watch(stop), name="stop-watch")
        loops: dict[str, Coroutine[Any, Any, Any]] = {"completer": self.completer.run()}
        loops.update({periodic.name: periodic.run() for periodic in self.periodic})
        if self.settings.notify:
            loops["listener"] = self.claimer.listen(self.database_url)
        loops["claimer"] = self.claimer.run(sup.stopping)
        tasks = {name: sup.spawn(name, coro) for name, coro in loops.items()}
        claimer = tasks["claimer"]
        try:
            await sup.stopping.wait()
            self.claimer.wake.set()
            await asyncio.wait([claimer])
            released = await self.dispatcher.drain(self.settings.shutdown_grace)
            if released:
                log.info("released %d unfinished deliveries", released)
            writing = not tasks["completer"].done()  # a crashed completer writes nothing more
            if not writing or not await self.completer.flush(FLUSH_AFTER_STOP):
                log.error(
                    "%d outcomes could not be written before stopping; their claims will be "
                    "reclaimed when their lease expires",
                    self.completer.queued,
                )
        finally:
            watcher.cancel()
            await sup.cancel(*tasks)  # the shard manager is serve()'s: it releases last
            await self.claims.close()
        log.info("poller %s stopped", self.poller_id)
        sup.raise_if_failed()

    async def _watch(self, stop: asyncio.Event) -> None:
        await stop.wait()
        self.supervisor.stop()


async def check_secrets(engine: AsyncEngine, keyring: Keyring) -> None:
    """Every endpoint's signing secret opens with the keyring, or ConfigurationError
    naming the endpoints (a poller with the wrong POLLER_SECRETS_KEY must not start)."""
    async with engine.connect() as conn:
        rows = (await conn.execute(queries.EVERY_ENDPOINT)).all()
    unreadable = [e for e in (Endpoint.from_row(row, keyring) for row in rows) if e.secret_error]
    if unreadable:
        names = ", ".join(e.name for e in unreadable[:5])
        more = f" and {len(unreadable) - 5} more" if len(unreadable) > 5 else ""
        raise ConfigurationError(
            f"cannot read the signing secret of endpoint {names}{more}: "
            f"{unreadable[0].secret_error}"
        )


async def check_operator_endpoint(engine: AsyncEngine, name: str | None) -> None:
    """POLLER_OPERATOR_ENDPOINT names an endpoint, or ConfigurationError."""
    if name is None:
        return
    async with engine.connect() as conn:
        found = (await conn.execute(queries.ENDPOINT_ID, {"name": name})).first()
    if found is None:
        raise ConfigurationError(
            f"POLLER_OPERATOR_ENDPOINT={name}: no such endpoint "
            f"(create it with 'poller endpoints add {name} URL')"
        )


async def _started(
    engine: AsyncEngine, settings: Settings, backend: str, stop: asyncio.Event
) -> bool:
    """Check the schema and the cluster's settings, waiting out a database that is away
    (a poller restarted while PostgreSQL restarts must not exit). False if stopped first."""
    outage = OutageLog("starting")
    delay = 0.1
    while not stop.is_set():
        try:
            await check_schema(engine)
            await check_cluster(engine, settings.shards, backend)
            await check_secrets(engine, settings.keyring)
            await check_operator_endpoint(engine, settings.operator_endpoint)
        except Exception as exc:
            if not is_transient(exc):
                raise
            outage.failed(exc)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await stop.wait()
            delay = min(delay * 2, 5.0)
            continue
        outage.recovered()
        return True
    return False


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
    on_event: Sequence[EventHook] = (),
    telemetry: Telemetry | None = None,
) -> Poller:
    """A whole poller: shard leadership, claiming and delivering, until ``stop``.

    Leases are taken before the first claim and given up only after the last
    delivery has been written (graceful stop), so shards pass straight on.
    ``ready`` receives the Poller once it runs (tests and the demo watch it).
    ``on_event``: callables given each operational event (poller/rows/events.py)
    after the change it reports committed; they must not block. ``telemetry``: the
    attempt spans (poller/observe/otel.py); None: off.
    Raises ServiceCrashed when a loop crashed (after stopping gracefully).
    """
    backend = elector.backend if elector is not None else settings.election_backend
    elector = elector or make_elector(
        settings.election_backend, owner=poller_id, engine=engine, redis_url=settings.redis_url
    )
    supervisor = Supervisor()
    metrics.DELIVERIES.labels.limit = settings.metrics_endpoints  # the process's, at start
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
        supervisor=supervisor,
        telemetry=telemetry,
    )
    poller.on_event.extend(on_event)
    holder.append(poller)
    poller.shards = manager
    try:
        started = await _started(engine, settings, backend, stop)
    except BaseException:
        await elector.close()
        raise
    if not started:
        await elector.close()
        return poller  # stopped while waiting for the database: nothing claimed
    await manager.tick()
    manager_stop = asyncio.Event()
    leadership = supervisor.spawn("shard-manager", manager.run(manager_stop))
    try:
        async with serving(settings.metrics_addr, engine, supervisor) as port:
            poller.ops_port = port
            if ready is not None:
                ready.set_result(poller)
            await poller.run(stop)
    finally:
        supervisor.stop()  # the shard manager returning now is expected
        manager_stop.set()
        await asyncio.wait([leadership])
        await manager.stop()
        await elector.close()
    return poller
