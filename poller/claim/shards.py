"""Shard leadership for one poller: what it may claim, and under which fences.

Buckets 0–255 (a stable hash of the endpoint) map to shards by
``bucket % shards``. Each poller runs one :class:`ShardManager`; every
``lease_ttl / 3`` it ticks::

                 ┌──────────── heartbeat fails ─────────────┐
                 ▼                                          │
    ┌────────────────────────┐   backend back    ┌──────────┴──────────┐
    │ BACKEND DOWN           │ ────────────────▶ │ ELECTED             │
    │ open: claim all shards │                   │ renew held leases;  │
    │ closed: claim nothing  │ ◀──────────────── │ release beyond the  │
    └────────────────────────┘   heartbeat fails │ fair share ⌈S/P⌉    │
                                                 │ (after draining);   │
                                                 │ acquire up to it    │
                                                 └─────────────────────┘

A held shard is *claimable* only while the local monotonic clock is inside
``acquired_at + ttl − margin`` (``acquired_at`` is taken before the request
that won or renewed the lease, so this always ends before the backend's own
expiry): a leader that cannot renew stops claiming before anyone else can
take over. Every claim carries the shard fences, which PostgreSQL checks and
advances (poller/rows/claims.py); a shard whose fence is refused is dropped at
once. A newly won shard's fence is written to PostgreSQL straight away, so the
previous holder is shut out from that moment, not from the new one's first
claim.

The ``maintenance`` lease elects one poller to reclaim expired claims and
purge by retention. With election ``none`` every poller does everything; with
the backend down and fail-open, every poller claims everything and sweeps —
both correct, because rows are claimed with SKIP LOCKED and fenced by claim
tokens (docs/explanation/design.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncEngine

from poller.election import MAINTENANCE, Elector, Lease, shard_key
from poller.errors import ConfigurationError, ElectionUnavailable
from poller.observe import metrics
from poller.observe.logs import OutageLog
from poller.store import queries
from poller.store.db import TRANSIENT
from poller.store.schema import BUCKETS

log = logging.getLogger("poller.claim.shards")


@dataclass(frozen=True, slots=True)
class ClaimScope:
    """What a claim may take: ``buckets`` (None: all) under ``fences`` (None: unfenced)."""

    buckets: tuple[int, ...] | None
    fences: dict[int, int] | None
    shards: int
    maintenance: bool


async def check_cluster(engine: AsyncEngine, shards: int, election: str = "postgres") -> None:
    """Record the cluster's shard count and election backend, or refuse a poller that
    disagrees: pollers electing through different backends would each lead every shard."""
    async with engine.begin() as conn:
        recorded = {}
        for key, value in (("shards", str(shards)), ("election", election)):
            fact = None
            while fact is None:
                # A poller recording it at the same moment makes our INSERT a no-op
                # whose snapshot predates its row: the next statement sees it.
                result = await conn.execute(queries.CLUSTER_FACT, {"key": key, "value": value})
                fact = result.scalar_one_or_none()
            recorded[key] = fact
        await conn.execute(queries.ENSURE_SHARD_FENCES, {"shards": int(recorded["shards"])})
    if int(recorded["shards"]) != shards:
        raise ConfigurationError(
            f"POLLER_SHARDS={shards}, but this database's pollers use {recorded['shards']} "
            "shards; every poller must use the same number"
        )
    if recorded["election"] != election:
        raise ConfigurationError(
            f"POLLER_ELECTION={election}, but this database's pollers elect through "
            f"{recorded['election']!r}; every poller must use the same backend"
        )


class ShardManager:
    def __init__(
        self,
        elector: Elector,
        engine: AsyncEngine,
        *,
        shards: int,
        lease_ttl: float,
        fail_open: bool = True,
        in_flight: Callable[[int], int] = lambda shard: 0,
    ) -> None:
        self.elector = elector
        self.engine = engine
        self.shards = shards
        self.ttl = lease_ttl
        self.margin = lease_ttl / 5
        self.fail_open = fail_open
        self.in_flight = in_flight
        self.unfenced = not elector.fenced
        self.held: dict[int, Lease] = {}
        self.draining: set[int] = set()
        self.maintenance: Lease | None = None
        self.backend_ok = True
        self.members: list[str] = []
        self.changes = 0  # leadership gained or lost
        self.stale_leader_claims = 0
        self.backend_errors = 0
        self.tick_interval = lease_ttl / 3
        self._outage = OutageLog("shard bookkeeping")
        self._buckets: dict[tuple[int, ...], tuple[int, ...]] = {}  # shards -> their buckets

    # -- the scope the claimer asks for -------------------------------------------

    def scope(self) -> ClaimScope:
        if self.unfenced:
            return ClaimScope(None, None, self.shards, maintenance=True)
        if not self.backend_ok:
            if self.fail_open:
                return ClaimScope(None, None, self.shards, maintenance=True)
            return ClaimScope((), None, self.shards, maintenance=False)
        now = time.monotonic()
        live = {
            s: lease
            for s, lease in self.held.items()
            if s not in self.draining and now < lease.acquired_at + lease.ttl - self.margin
        }
        buckets = self._buckets_of(tuple(sorted(live)))
        fences = {s: lease.fence for s, lease in live.items()}
        maintenance = self.maintenance is not None and (
            now < self.maintenance.acquired_at + self.maintenance.ttl - self.margin
        )
        return ClaimScope(buckets, fences, self.shards, maintenance)

    def _buckets_of(self, shards: tuple[int, ...]) -> tuple[int, ...]:
        """The buckets of these shards (asked for by every claim: kept per set of shards)."""
        buckets = self._buckets.get(shards)
        if buckets is None:
            if len(self._buckets) >= 64:
                self._buckets.clear()
            held = set(shards)
            buckets = self._buckets[shards] = tuple(
                b for b in range(BUCKETS) if b % self.shards in held
            )
        return buckets

    def refused(self, shards: list[int]) -> None:
        """PostgreSQL refused these shards' fences: someone newer leads them."""
        for shard in shards:
            self.stale_leader_claims += 1
            metrics.STALE_LEADER_CLAIMS.inc()
            if self.held.pop(shard, None) is not None:
                self._changed()
                log.warning("shard %d: fence refused by PostgreSQL, a newer leader has it", shard)

    def _changed(self) -> None:
        self.changes += 1
        metrics.LEADERSHIP_CHANGES.inc()
        metrics.SHARDS_HELD.set(len(self.held))

    # -- the loop ---------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.tick()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.tick_interval * random.uniform(0.9, 1.1)):
                    await stop.wait()

    async def tick(self) -> None:
        if self.unfenced:
            return
        try:
            self.members = await self.elector.heartbeat(self.ttl)
            await self._renew()
            await self._balance()
            await self._maintenance()
        except TRANSIENT as exc:  # PostgreSQL away or busy, not the backend: try next tick
            self._outage.failed(exc)
            return
        except ElectionUnavailable as exc:
            self.backend_errors += 1
            metrics.ELECTION_BACKEND_ERRORS.inc()
            metrics.ELECTION_BACKEND_UP.set(0)
            if self.backend_ok:
                mode = (
                    "claiming from every shard (fail open)"
                    if self.fail_open
                    else ("claiming nothing (fail closed)")
                )
                log.error("election backend unavailable, %s: %s", mode, exc)
            self.backend_ok = False
            return
        self._outage.recovered()
        if not self.backend_ok:
            log.warning("election backend is back; claiming by lease again")
        self.backend_ok = True
        metrics.ELECTION_BACKEND_UP.set(1)

    async def _renew(self) -> None:
        for shard, lease in list(self.held.items()):
            renewed = await self.elector.renew(lease)
            if renewed is None:
                del self.held[shard]
                self._changed()
                log.warning("shard %d: lease lost", shard)
            else:
                self.held[shard] = renewed

    async def _balance(self) -> None:
        share = math.ceil(self.shards / max(1, len(self.members)))
        for shard in sorted(self.draining):
            if self.in_flight(shard) == 0:
                await self._release(shard)
        extra = len(self.held) - len(self.draining) - share
        for shard in sorted(set(self.held) - self.draining, reverse=True)[: max(0, extra)]:
            self.draining.add(shard)  # stop claiming; release once its deliveries finish
            if self.in_flight(shard) == 0:
                await self._release(shard)
        if len(self.held) >= share:
            return
        floors = await self._floors()
        free = [s for s in range(self.shards) if s not in self.held]
        random.shuffle(free)
        for shard in free:
            if len(self.held) >= share:
                break
            lease = await self.elector.acquire(shard_key(shard), self.ttl, floors.get(shard, 0))
            if lease is None:
                continue
            try:
                fenced = await self._fence_now(shard, lease)
            except TRANSIENT:
                await self.elector.release(lease)  # try again next tick
                raise
            if fenced:
                self.held[shard] = lease
                self._changed()
                log.info("shard %d: leading with fence %d", shard, lease.fence)

    async def _maintenance(self) -> None:
        if self.maintenance is not None:
            self.maintenance = await self.elector.renew(self.maintenance)
        if self.maintenance is None:
            self.maintenance = await self.elector.acquire(MAINTENANCE, self.ttl)

    async def _release(self, shard: int) -> None:
        lease = self.held.pop(shard, None)
        self.draining.discard(shard)
        if lease is not None:
            self._changed()
            await self.elector.release(lease)
            log.info("shard %d: released", shard)

    async def _floors(self) -> dict[int, int]:
        async with self.engine.connect() as conn:
            rows = (await conn.execute(queries.SHARD_FENCES)).all()
        return {int(r.shard): int(r.fence) for r in rows}

    async def _fence_now(self, shard: int, lease: Lease) -> bool:
        """Write a new lease's fence to PostgreSQL at once, shutting the old leader out."""
        params = {
            "fences": json.dumps([{"shard": shard, "fence": lease.fence}]),
            "holder": self.elector.owner,
        }
        async with self.engine.begin() as conn:
            # Do not queue behind a frozen old leader's claim: fail this tick instead
            # (its session is ended by idle_in_transaction_session_timeout).
            wait_ms = max(100, int(self.tick_interval * 1000))
            await conn.execute(queries.LOCK_TIMEOUT, {"ms": wait_ms})
            accepted = (await conn.execute(queries.FENCE_SHARDS, params)).all()
        if not accepted:
            log.warning("shard %d: fence %d is below PostgreSQL's; not leading", shard, lease.fence)
            await self.elector.release(lease)
            return False
        return True

    async def stop(self) -> None:
        """Graceful stop: give every lease up at once so others take over now."""
        with contextlib.suppress(ElectionUnavailable):
            for shard in list(self.held):
                await self._release(shard)
            if self.maintenance is not None:
                await self.elector.release(self.maintenance)
                self.maintenance = None
            await self.elector.leave()


@dataclass(frozen=True, slots=True)
class ShardHolding:
    """Who leads a shard (by the election backend) and the fence PostgreSQL last accepted."""

    key: str
    holder: str | None
    fence: int | None
    expires_in: float | None
    accepted_fence: int | None


async def lease_holdings(elector: Elector, engine: AsyncEngine) -> list[ShardHolding]:
    """Every shard and the maintenance lease: holder, fence, seconds left, accepted fence.

    (``poller admin leases`` prints this.)
    """
    live = {h.key: h for h in await elector.holders()}
    async with engine.connect() as conn:
        accepted = {
            int(r.shard): int(r.fence) for r in (await conn.execute(queries.SHARD_FENCES)).all()
        }
    keys = [shard_key(s) for s in sorted(accepted)] + [MAINTENANCE]
    result = []
    for key in keys:
        held = live.get(key)
        shard = int(key.partition(":")[2]) if key.startswith("shard:") else None
        result.append(
            ShardHolding(
                key,
                held.owner if held else None,
                held.fence if held else None,
                held.expires_in if held else None,
                accepted.get(shard) if shard is not None else None,
            )
        )
    return result
