"""Operations endpoints on ``POLLER_METRICS_ADDR``: /metrics, /healthz, /readyz.

* ``/metrics`` — Prometheus text format (poller/observe/metrics.py).
* ``/healthz`` — the process is alive, its event loop answers (a blocked
  loop cannot answer at all, so the prober's timeout catches it) and none of
  its supervised loops has crashed (503 naming the loop otherwise: the poller
  is stopping and will exit non-zero); reports the loop's recent scheduling lag.
* ``/readyz`` — healthy as above, PostgreSQL answers within 2 s and its schema
  is at the revision this poller needs; 503 with the reason otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy.ext.asyncio import AsyncEngine

from poller.errors import ConfigurationError
from poller.service.supervise import Supervisor
from poller.store import queries
from poller.store.migrate import head_revision

LAG_PROBE = 0.5
log = logging.getLogger("poller.service.ops")


class Ops:
    def __init__(self, engine: AsyncEngine, supervisor: Supervisor | None = None) -> None:
        self.engine = engine
        self.supervisor = supervisor
        self.head = head_revision()
        self.lag = 0.0

    def _crashed(self) -> web.Response | None:
        if self.supervisor is None or self.supervisor.healthy:
            return None
        return web.json_response(
            {"status": "crashed", "reason": self.supervisor.failure}, status=503
        )

    async def metrics(self, request: web.Request) -> web.Response:
        """Prometheus text; OpenMetrics (with exemplars: the trace of a delivery's latency)
        to a scraper that asks for it (``Accept: application/openmetrics-text``)."""
        if "application/openmetrics-text" in request.headers.get("Accept", ""):
            from prometheus_client import REGISTRY
            from prometheus_client.openmetrics import exposition

            return web.Response(
                body=exposition.generate_latest(REGISTRY),  # type: ignore[no-untyped-call]
                headers={"Content-Type": exposition.CONTENT_TYPE_LATEST},
            )
        body = generate_latest()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(self, _: web.Request) -> web.Response:
        crashed = self._crashed()
        if crashed is not None:
            return crashed
        return web.json_response({"status": "ok", "loop_lag_seconds": round(self.lag, 4)})

    async def readyz(self, _: web.Request) -> web.Response:
        crashed = self._crashed()
        if crashed is not None:
            return crashed
        try:
            async with asyncio.timeout(2.0), self.engine.connect() as conn:
                revision = (await conn.execute(queries.SCHEMA_REVISION)).scalar()
        except Exception as exc:  # any failure to answer means not ready
            return web.json_response(
                {"status": "unavailable", "reason": f"database: {type(exc).__name__}"}, status=503
            )
        if revision != self.head:
            return web.json_response(
                {"status": "unavailable", "reason": f"schema at {revision}, needs {self.head}"},
                status=503,
            )
        return web.json_response({"status": "ready", "revision": revision})

    async def watch_lag(self) -> None:
        while True:
            began = time.monotonic()
            await asyncio.sleep(LAG_PROBE)
            self.lag = max(0.0, time.monotonic() - began - LAG_PROBE)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@contextlib.asynccontextmanager
async def listening(
    addr: str, metrics: Handler, healthz: Handler, readyz: Handler
) -> AsyncIterator[int]:
    """/metrics, /healthz and /readyz on ``host:port`` while the block runs; yields the
    port bound (port 0: the kernel's choice, logged)."""
    host, _, port = addr.rpartition(":")
    app = web.Application()
    app.add_routes(
        [web.get("/metrics", metrics), web.get("/healthz", healthz), web.get("/readyz", readyz)]
    )
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host.strip("[]"), int(port)).start()
    except OSError as exc:  # taken, or an address this host does not have
        await runner.cleanup()
        raise ConfigurationError(
            f"POLLER_METRICS_ADDR={addr}: cannot listen there: {exc.strerror or exc}"
        ) from exc
    bound = runner.addresses[0][1] if runner.addresses else int(port)
    log.info("serving /metrics, /healthz, /readyz on %s:%d", host, bound)
    try:
        yield int(bound)
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def serving(
    addr: str | None, engine: AsyncEngine, supervisor: Supervisor | None = None
) -> AsyncIterator[int | None]:
    """Serve the ops endpoints on ``host:port`` while the block runs; yields the port."""
    if not addr:
        yield None
        return
    ops = Ops(engine, supervisor)
    async with listening(addr, ops.metrics, ops.healthz, ops.readyz) as bound:
        lag = asyncio.create_task(ops.watch_lag(), name="ops-lag")
        try:
            yield bound
        finally:
            lag.cancel()
