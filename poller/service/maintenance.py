"""Periodic services: small objects with ``run_once()``, run on a jittered interval.

:class:`Periodic` runs one service River-style: sleep the interval (±20 %
jitter, so pollers started together do not act together), run it if its
condition holds, repeat. A transient database error is counted and logged
(once per outage, then once per interval) and the next run tries again; any
other exception escapes, and the supervisor (poller/service/supervise.py) stops the
poller loudly.

Leader-only maintenance — run by the poller holding the ``maintenance`` lease
(every poller, with election ``none`` or a failed-open backend: each locks
with SKIP LOCKED and touches only rows nobody holds, so that is safe):

* :class:`Reclaimer` — expired claims back to pending + ``needs_lookup`` (or
  failed when their attempts are spent), within ``claim_lease + sweep_interval``;
  and ordering keys whose head ended but that no completion could hand on
  (their row was held, and the poller stopped before it came back to it).
* :class:`Purger` — delivered and failed rows past their retention, with their
  attempts, in batches of :data:`PURGE_BATCH` (one transaction each, so no lock
  is held for long) until it has caught up or spent :data:`PURGE_BUDGET`
  seconds of the run — one batch per run could not keep up with a poller that
  delivers thousands a second; their keys stay *spent* for
  ``POLLER_RETENTION_KEYS`` (re-enqueueing one is refused), and events whose
  rows are all gone go after ``POLLER_RETENTION_EVENTS``. ``poller admin purge``
  runs the same plan (:func:`retention_plan`) at once, through :func:`purge`.
* :class:`GaugeRefresher` — the cluster-wide gauges (due messages and the
  oldest one's age per endpoint, messages by status).

Every poller also runs the claim-lease heartbeat (``Completer.extend_leases``,
poller/complete/completer.py) as a Periodic.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Protocol

from sqlalchemy import Engine
from sqlalchemy.ext.asyncio import AsyncEngine

from poller.observe import metrics
from poller.observe.logs import OutageLog
from poller.rows.completions import Completions
from poller.store import queries
from poller.store.db import is_transient

log = logging.getLogger("poller.service.maintenance")

PURGE_BATCH = 1000
PURGE_BUDGET = 2.0  # seconds of batches per run (the sweep interval is 5 s by default)
JITTER = 0.2


class Service(Protocol):
    async def run_once(self) -> int: ...


class Periodic:
    """Run ``service.run_once()`` every ``interval`` seconds (jittered) while ``when()`` holds."""

    def __init__(
        self,
        name: str,
        service: Service,
        interval: float,
        *,
        when: Callable[[], bool] = lambda: True,
        after: Callable[[int], object] | None = None,
    ) -> None:
        self.name = name
        self.service = service
        self.interval = interval
        self.when = when
        self.after = after
        self._outage = OutageLog(name)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval * random.uniform(1 - JITTER, 1 + JITTER))
            if not self.when():
                continue
            try:
                done = await self.service.run_once()
            except Exception as exc:
                if not is_transient(exc):
                    raise
                self._outage.failed(exc)
                continue
            self._outage.recovered()
            if self.after is not None:
                self.after(done)


class Call:
    """A plain coroutine function as a Service."""

    def __init__(self, run: Callable[[], Awaitable[int]]) -> None:
        self._run = run

    async def run_once(self) -> int:
        return await self._run()


KEY_SWEEP_EVERY = 12
"""Reclaimer runs between two scans for keys no completion could hand on (a minute at the
default sweep interval): the scan reads every live key, and such a key exists only when
a poller stopped while an application held it (a live poller hands it on itself)."""


class Reclaimer:
    def __init__(self, completions: Completions) -> None:
        self.completions = completions
        self.reclaimed = 0
        self._runs = 0

    async def run_once(self) -> int:
        result = await self.completions.reclaim_expired()
        self.completions.events.notify(result.events)
        self._runs += 1
        handed = await self.completions.sweep_follow_ups(keys=self._runs % KEY_SWEEP_EVERY == 1)
        if handed:
            log.info("handed on %d ordering keys whose head had ended", handed)
        count = len(result.pending) + len(result.failed)
        if count:
            self.reclaimed += count
            metrics.RECLAIMED.inc(count)
            log.warning(
                "reclaimed %d expired claims (%d failed for good)", count, len(result.failed)
            )
        return count


def retention_plan(
    *,
    delivered_age: float | None,
    failed_age: float | None,
    keys_age: float | None = 90 * 86400.0,
    events_age: float | None = 7 * 86400.0,
) -> list[tuple[str, queries.Statement, float]]:
    """What a purge deletes, in order, as (kind, statement, age in seconds); an age of
    None keeps that kind. Events come after the rows: an event goes with its last row."""
    plan = (
        ("delivered", queries.PURGE_DELIVERED, delivered_age),
        ("failed", queries.PURGE_FAILED, failed_age),
        ("cancelled", queries.PURGE_CANCELLED, failed_age),  # kept as long as failures
        ("spent_keys", queries.PURGE_SPENT_KEYS, keys_age),
        ("events", queries.PURGE_EVENTS, events_age),
    )
    return [(kind, statement, age) for kind, statement, age in plan if age is not None]


def purge(engine: Engine, plan: list[tuple[str, queries.Statement, float]]) -> dict[str, int]:
    """Run ``plan`` to the end now, in batches of :data:`PURGE_BATCH` (one transaction
    each); rows deleted by kind. The operator's purge (``poller admin purge``)."""
    deleted: dict[str, int] = {}
    for kind, statement, age in plan:
        deleted[kind] = 0
        while True:
            with engine.begin() as conn:
                params = {"age": age, "limit": PURGE_BATCH}
                purged = int(conn.execute(statement, params).scalar_one())
            deleted[kind] += purged
            if purged < PURGE_BATCH:
                break
    return deleted


class Purger:
    """The leader's purge: :func:`retention_plan` with the retention settings, a budget
    of :data:`PURGE_BUDGET` seconds per run."""

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        delivered_age: float,
        failed_age: float,
        keys_age: float = 90 * 86400.0,
        events_age: float = 7 * 86400.0,
    ) -> None:
        self.engine = engine
        self.plan = retention_plan(
            delivered_age=delivered_age,
            failed_age=failed_age,
            keys_age=keys_age,
            events_age=events_age,
        )
        self.purged = 0

    async def run_once(self) -> int:
        """Batches of each kind until a batch comes back short or the budget is spent;
        the next run goes on where this one stopped."""
        count = 0
        deadline = asyncio.get_running_loop().time() + PURGE_BUDGET
        for _kind, statement, age in self.plan:
            while True:
                async with self.engine.begin() as conn:
                    result = await conn.execute(statement, {"age": age, "limit": PURGE_BATCH})
                    purged = int(result.scalar_one())
                count += purged
                if purged < PURGE_BATCH or asyncio.get_running_loop().time() > deadline:
                    break
        if count:
            self.purged += count
            log.info("purged %d rows past their retention", count)
        return count


CIRCUIT_LEVELS = {"closed": 0, "half_open": 1, "open": 2}


class GaugeRefresher:
    """The cluster-wide gauges, from the maintenance leader: messages by status, and
    per endpoint the ones GAUGE_ENDPOINTS shows (something due, waiting, blocked, a
    circuit not closed, disabled). An endpoint that comes to rest loses its series,
    as does one removed: at rest, an endpoint costs no series and no work here."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self._shown: set[str] = set()

    async def run_once(self) -> int:
        async with self.engine.connect() as conn:
            shown = (await conn.execute(queries.GAUGE_ENDPOINTS)).all()
            by_status = (await conn.execute(queries.GAUGE_STATUS)).all()
        names = {row.name for row in shown}
        for gone in self._shown - names:
            for gauge in PER_ENDPOINT:
                with contextlib.suppress(KeyError):
                    gauge.remove(gone)
        self._shown = names
        for row in shown:
            metrics.PENDING_DUE.labels(row.name).set(row.due)
            metrics.OLDEST_DUE_SECONDS.labels(row.name).set(float(row.oldest_seconds))
            metrics.ORDERING_BLOCKED_KEYS.labels(row.name).set(row.blocked)
            metrics.ORDERING_BLOCKED_SECONDS.labels(row.name).set(float(row.blocked_seconds))
            metrics.ORDERING_WAITING.labels(row.name).set(row.waiting)
            metrics.CIRCUIT_STATE.labels(row.name).set(CIRCUIT_LEVELS.get(row.state, 0))
            metrics.CIRCUIT_OPEN_SECONDS.labels(row.name).set(float(row.open_seconds))
            metrics.ENDPOINT_ENABLED.labels(row.name).set(1 if row.enabled else 0)
            metrics.DISABLED_PENDING.labels(row.name).set(row.disabled_pending)
        for row in by_status:
            metrics.MESSAGES.labels(row.status).set(row.n)
        return 0


# The gauges GaugeRefresher sets per endpoint.
PER_ENDPOINT = (
    metrics.PENDING_DUE,
    metrics.OLDEST_DUE_SECONDS,
    metrics.ORDERING_BLOCKED_KEYS,
    metrics.ORDERING_BLOCKED_SECONDS,
    metrics.ORDERING_WAITING,
    metrics.CIRCUIT_STATE,
    metrics.CIRCUIT_OPEN_SECONDS,
    metrics.ENDPOINT_ENABLED,
    metrics.DISABLED_PENDING,
)
