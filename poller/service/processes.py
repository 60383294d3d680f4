"""``poller run --processes N``: several poller processes on one host, one supervisor.

One Python process delivers on one core. A host with more cores runs N member
processes under this supervisor; each child is an ordinary ``poller run`` (its
own engine, sender and election membership), so shards spread across children
and hosts alike and the row-level guarantees are unchanged.

The supervisor:

* **starts** child ``i`` as ``poller run --id <base>-<i>`` (``<base>-<i>.<n>``
  after its n-th restart: a new member, never a second holder of the old one's
  leases; ``<base>`` is ``--id`` plus the supervisor's PID, so children a killed
  supervisor left draining never share a name with its replacement's) in its own
  session, so a terminal's Ctrl-C reaches the supervisor
  only and each child sees one signal;
* **restarts** a child that exits while the supervisor runs, after a back-off
  of 1 s doubling to 30 s (reset once a child has run for a minute). A child
  that exits 2 (bad settings, unmigrated database) is not restarted: the same
  settings fail again, so the supervisor stops the others and exits 2;
* **kills and restarts** a child whose ``/healthz`` has not answered for
  ``POLLER_CHILD_HUNG_AFTER`` seconds (a blocked event loop cannot answer). A
  child that has not answered yet is starting (imports, database checks on a
  busy host take seconds): it has ``STARTUP_GRACE`` (120 s) or the hung
  allowance, whichever is longer, so a slow start is never mistaken for a hang;
* **forwards** SIGTERM/SIGINT as one SIGTERM to every child and waits for their
  graceful drains; a second signal is forwarded too (children exit at once);
* **serves one ops endpoint** on ``POLLER_METRICS_ADDR``. Each child serves its
  own on a port of 127.0.0.1 chosen by the kernel and written to a file the
  supervisor reads. ``/metrics`` merges the children's metrics with a
  ``process="<i>"`` label (sum across it, as across hosts) plus the
  supervisor's own; ``/healthz`` lists the children and is 503 only when none
  runs; ``/readyz`` is 200 when every child is ready.

Per-child ports were chosen over prometheus-client's multiprocess mode: that
mode cannot remove a labelled series (a deleted endpoint's gauges would stay),
needs its environment before the first import, and would hide which child is
slow. A child whose supervisor dies (SIGKILL) notices within a second and
stops gracefully (``POLLER_SUPERVISOR_PID``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Metric,
    generate_latest,
)
from prometheus_client.parser import text_string_to_metric_families

from poller.service.ops import listening

log = logging.getLogger("poller.service.processes")

BACKOFF_FIRST = 1.0
BACKOFF_MAX = 30.0
STABLE_AFTER = 60.0  # a child that ran this long restarts after BACKOFF_FIRST again
PROBE_EVERY = 2.0
HUNG_AFTER = 30.0
STARTUP_GRACE = 120.0  # until a child's first /healthz answer (see the module docstring)
PROBE_TIMEOUT = 2.0
EXIT_USAGE = 2
EXIT_CRASHED = 70  # as `poller run` after a crash
ENV_SUPERVISOR = "POLLER_SUPERVISOR_PID"
ENV_PORT_FILE = "POLLER_OPS_PORT_FILE"


@dataclass
class Child:
    index: int
    base: str
    generation: int = 0
    proc: asyncio.subprocess.Process | None = None
    started: float = 0.0
    port: int | None = None
    answered: float = 0.0
    serving: bool = False  # its /healthz has answered since it was started
    backoff: float = BACKOFF_FIRST
    last_exit: int | None = None
    waiter: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        suffix = f".{self.generation}" if self.generation else ""
        return f"{self.base}-{self.index}{suffix}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.returncode is None


class Fleet:
    """The supervisor of ``count`` child pollers (see the module docstring)."""

    def __init__(
        self,
        count: int,
        *,
        base: str,
        env: dict[str, str],
        metrics_addr: str | None,
        hung_after: float = HUNG_AFTER,
    ) -> None:
        self.hung_after = hung_after
        self.children = [Child(i, base) for i in range(count)]
        self.env = env
        self.metrics_addr = metrics_addr
        self.stopping = asyncio.Event()
        self.exit_code = 0
        self.signals = 0
        self.run_dir: Path | None = None  # made by run(): children write their ports there
        self.registry = CollectorRegistry()
        self.registry.register(_Merged(self))
        self.restarts = Counter(
            "webhook_poller_child_restarts",
            "Child pollers restarted by `poller run --processes` (crashed, killed or hung).",
            registry=self.registry,
        )
        self.up = Gauge(
            "webhook_poller_children_up",
            "Child pollers running under this supervisor.",
            registry=self.registry,
        )
        self.up.set_function(lambda: sum(c.running for c in self.children))
        self.session: aiohttp.ClientSession | None = None
        self._scraped: list[tuple[int, str]] = []

    # -- lifecycle ---------------------------------------------------------

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self.on_signal, signum)
        # A fresh 0700 directory of our own: a predictable name another user of the
        # host made first could feed us its ports to scrape.
        self.run_dir = Path(tempfile.mkdtemp(prefix=f"poller-fleet-{os.getpid()}-"))
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=PROBE_TIMEOUT))
        try:
            async with self._serving():
                for child in self.children:
                    await self._start_or_stop(child)
                prober = asyncio.create_task(self._probe_loop(), name="fleet-probe")
                await self.stopping.wait()
                await self._stop_all()
                prober.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await prober
        finally:
            await self.session.close()
            shutil.rmtree(self.run_dir, ignore_errors=True)
        return self.exit_code

    def on_signal(self, signum: int) -> None:
        self.signals += 1
        if self.signals == 1:
            log.info(
                "%s: stopping %d children gracefully",
                signal.Signals(signum).name,
                len(self.children),
            )
        else:
            log.warning("second signal: children exit now")
            self.exit_code = 130
        self._signal_all(signal.SIGTERM)
        self.stopping.set()

    def _signal_all(self, signum: int) -> None:
        for child in self.children:
            if child.running and child.proc is not None:
                with contextlib.suppress(ProcessLookupError):
                    child.proc.send_signal(signum)

    async def _stop_all(self) -> None:
        if self.signals == 0:  # stopping for a child's exit 2, not a signal
            self._signal_all(signal.SIGTERM)
        while waiters := [c.waiter for c in self.children if c.waiter and not c.waiter.done()]:
            await asyncio.gather(*waiters, return_exceptions=True)  # a restart may add one

    async def _start(self, child: Child) -> None:
        assert self.run_dir is not None
        port_file = self.run_dir / f"{child.index}.port"
        port_file.unlink(missing_ok=True)
        env = {
            **self.env,
            "POLLER_METRICS_ADDR": "127.0.0.1:0",
            ENV_SUPERVISOR: str(os.getpid()),
            ENV_PORT_FILE: str(port_file),
        }
        child.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "poller", "run", "--id", child.name,
            env=env, start_new_session=True,
        )  # fmt: skip
        if self.stopping.is_set():  # the stop came while it was being started
            child.proc.send_signal(signal.SIGTERM)
        child.started = child.answered = time.monotonic()
        child.port = None
        child.serving = False
        log.info("child %d started: %s (pid %d)", child.index, child.name, child.proc.pid)
        child.waiter = asyncio.create_task(self._watch(child), name=f"fleet-child-{child.index}")

    async def _watch(self, child: Child) -> None:
        assert child.proc is not None
        code = await child.proc.wait()
        child.last_exit = code
        child.port = None
        if self.stopping.is_set():
            log.info("child %d (%s) stopped, exit %d", child.index, child.name, code)
            return
        if code == EXIT_USAGE:
            log.critical(
                "child %d (%s) exited 2 (settings or database refused): stopping all",
                child.index, child.name,
            )  # fmt: skip
            self.exit_code = EXIT_USAGE
            self.stopping.set()
            return
        if time.monotonic() - child.started >= STABLE_AFTER:
            child.backoff = BACKOFF_FIRST
        delay, child.backoff = child.backoff, min(child.backoff * 2, BACKOFF_MAX)
        log.warning(
            "child %d (%s) exited %d; restarting in %.0f s", child.index, child.name, code, delay
        )
        self.restarts.inc()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stopping.wait(), delay)
        if self.stopping.is_set():
            return
        child.generation += 1
        await self._start_or_stop(child)

    async def _start_or_stop(self, child: Child) -> None:
        """Start a child; if the OS refuses (no memory, no processes left), stop them all
        and exit 70 like a crashed poller, for the host's supervisor to deal with."""
        try:
            await self._start(child)
        except OSError as exc:
            log.critical("child %d could not be started (%s): stopping all", child.index, exc)
            self.exit_code = EXIT_CRASHED
            self.stopping.set()

    # -- health ------------------------------------------------------------

    async def _probe_loop(self) -> None:
        while True:
            await asyncio.sleep(PROBE_EVERY)
            await asyncio.gather(*(self._probe(c) for c in self.children if c.running))

    async def _probe(self, child: Child) -> None:
        port = self._port(child)
        now = time.monotonic()
        if port is not None:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                assert self.session is not None
                async with self.session.get(f"http://127.0.0.1:{port}/healthz") as response:
                    await response.read()
                    child.answered = now  # 503 (a crashed loop) answers: the child exits itself
                    child.serving = True
                    return
        allowed = self.hung_after if child.serving else max(self.hung_after, STARTUP_GRACE)
        if now - child.answered > allowed and child.proc is not None and child.running:
            log.error(
                "child %d (%s) has not answered /healthz %s %.0f s: killing it",
                child.index, child.name, "for" if child.serving else "since its start",
                now - child.answered,
            )  # fmt: skip
            with contextlib.suppress(ProcessLookupError):
                child.proc.kill()

    def _port(self, child: Child) -> int | None:
        if child.port is None and self.run_dir is not None:
            with contextlib.suppress(OSError, ValueError):
                child.port = int((self.run_dir / f"{child.index}.port").read_text())
        return child.port

    def status(self) -> list[dict[str, Any]]:
        return [
            {
                "index": c.index,
                "name": c.name,
                "pid": c.proc.pid if c.proc is not None else None,
                "running": c.running,
                "restarts": c.generation,
                "last_exit": c.last_exit,
            }
            for c in self.children
        ]

    # -- the ops endpoint ----------------------------------------------------

    async def _fetch_all(self, path: str) -> list[tuple[int, int, str]]:
        """(child index, HTTP status, body) from each running child that answers."""

        async def one(child: Child) -> tuple[int, int, str] | None:
            port = self._port(child)
            if port is None or self.session is None:
                return None
            try:
                async with self.session.get(f"http://127.0.0.1:{port}{path}") as response:
                    return child.index, response.status, await response.text(errors="replace")
            except (aiohttp.ClientError, TimeoutError):
                return None

        answers = await asyncio.gather(*(one(c) for c in self.children if c.running))
        return [a for a in answers if a is not None]

    async def metrics(self, _: web.Request) -> web.Response:
        self._scraped = [(i, body) for i, status, body in await self._fetch_all("/metrics")
                         if status == 200]  # fmt: skip
        body = generate_latest(self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(self, _: web.Request) -> web.Response:
        children = self.status()
        running = sum(c["running"] for c in children)
        status = "ok" if running else "down"
        return web.json_response(
            {"status": status, "children": children}, status=200 if running else 503
        )

    async def readyz(self, _: web.Request) -> web.Response:
        answers = {i: (status, body) for i, status, body in await self._fetch_all("/readyz")}
        missing = [c.index for c in self.children if answers.get(c.index, (0, ""))[0] != 200]
        if missing:
            return web.json_response(
                {"status": "unavailable", "reason": f"children not ready: {missing}"}, status=503
            )
        return web.json_response({"status": "ready", "children": len(self.children)})

    @contextlib.asynccontextmanager
    async def _serving(self) -> AsyncIterator[None]:
        if not self.metrics_addr:
            yield None
            return
        async with listening(self.metrics_addr, self.metrics, self.healthz, self.readyz):
            yield None


class _Merged:
    """A collector yielding the children's last scrape, each sample labelled ``process``."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet

    def collect(self) -> list[Metric]:
        families: dict[str, Metric] = {}
        for index, text in self.fleet._scraped:
            try:  # parsed whole first: a child's garbled answer must not spoil the others
                parsed = list(text_string_to_metric_families(text))
            except ValueError as exc:
                log.warning("child %d: unreadable /metrics skipped (%s)", index, exc)
                continue
            for family in parsed:
                merged = families.get(family.name)
                if merged is None:
                    merged = Metric(family.name, family.documentation, family.type, family.unit)
                    families[family.name] = merged
                for sample in family.samples:
                    labels = {**sample.labels, "process": str(index)}
                    merged.add_sample(sample.name, labels, sample.value, sample.timestamp)
        return list(families.values())


async def watch_supervisor(stop: asyncio.Event) -> None:
    """In a child: stop gracefully once the supervisor that started it is gone."""
    expected = int(os.environ[ENV_SUPERVISOR])
    while not stop.is_set():
        if os.getppid() != expected:
            log.warning("supervisor %d is gone: stopping gracefully", expected)
            stop.set()
            _forget_port()  # nobody reads it now; the last child out removes the directory
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)


def _forget_port() -> None:
    path = Path(os.environ[ENV_PORT_FILE])
    with contextlib.suppress(OSError):
        path.unlink(missing_ok=True)
        path.parent.rmdir()  # fails while another child's port file is still there


def write_port(port: int) -> None:
    """In a child: tell the supervisor which port the ops endpoint is on."""
    path = Path(os.environ[ENV_PORT_FILE])
    tmp = path.with_suffix(".tmp")
    tmp.write_text(str(port))
    tmp.replace(path)
