"""Leader-only maintenance: small services with ``run_once()`` on a jittered interval.

The poller holding the ``maintenance`` lease runs them (every poller, with
election ``none`` or a failed-open backend — they are safe to run anywhere:
each locks with SKIP LOCKED and touches only rows nobody holds).

* :class:`Reclaimer` — expired claims back to pending + ``needs_lookup`` (or
  failed when their attempts are spent), within ``claim_lease + sweep_interval``.
* :class:`Purger` — delivered and failed rows past their retention, with their
  attempts, in batches of :data:`PURGE_BATCH` so no lock is held for long.
* :class:`GaugeRefresher` — the cluster-wide gauges (due messages and the
  oldest one's age per endpoint, messages by status).
"""

from __future__ import annotations

import logging

from sqlalchemy.ext.asyncio import AsyncEngine

from poller import metrics, queries
from poller.claims import Claims

log = logging.getLogger("poller.maintenance")

PURGE_BATCH = 1000


class Reclaimer:
    def __init__(self, claims: Claims) -> None:
        self.claims = claims
        self.reclaimed = 0

    async def run_once(self) -> int:
        result = await self.claims.reclaim_expired()
        count = len(result.pending) + len(result.failed)
        if count:
            self.reclaimed += count
            metrics.RECLAIMED.inc(count)
            log.warning(
                "reclaimed %d expired claims (%d failed for good)", count, len(result.failed)
            )
        return count


class Purger:
    def __init__(self, engine: AsyncEngine, *, delivered_age: float, failed_age: float) -> None:
        self.engine = engine
        self.ages = ((queries.PURGE_DELIVERED, delivered_age), (queries.PURGE_FAILED, failed_age))
        self.purged = 0

    async def run_once(self) -> int:
        """One bounded batch of each kind; the next run takes the next batch."""
        count = 0
        for statement, age in self.ages:
            async with self.engine.begin() as conn:
                result = await conn.execute(statement, {"age": age, "limit": PURGE_BATCH})
                count += result.rowcount or 0
        if count:
            self.purged += count
            log.info("purged %d rows past their retention", count)
        return count


class GaugeRefresher:
    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self._endpoints: set[str] = set()

    async def run_once(self) -> int:
        async with self.engine.connect() as conn:
            due = (await conn.execute(queries.GAUGE_DUE)).all()
            by_status = (await conn.execute(queries.GAUGE_STATUS)).all()
        names = {row.name for row in due}
        for gone in self._endpoints - names:  # removed endpoints leave no stale series
            metrics.PENDING_DUE.remove(gone)
            metrics.OLDEST_DUE_SECONDS.remove(gone)
        self._endpoints = names
        for row in due:
            metrics.PENDING_DUE.labels(row.name).set(row.due)
            metrics.OLDEST_DUE_SECONDS.labels(row.name).set(float(row.oldest_seconds))
        for row in by_status:
            metrics.MESSAGES.labels(row.status).set(row.n)
        return 0
