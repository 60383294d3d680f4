"""``poller run``: the delivery service, with signal handling and the HTTP sender."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import socket
import sys
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

import click

from poller.cli.common import settings_and_url
from poller.cli.lazy import lazy
from poller.errors import ServiceCrashed

if TYPE_CHECKING:
    from poller.deliver import sending
    from poller.observe import logs, otel
    from poller.service import processes
    from poller.service import runner as service
    from poller.service.runner import Poller
    from poller.settings import Settings
    from poller.store import db
else:  # a flag refused (`--processes 0`) answers before the service is imported
    db, logs, otel = (
        lazy("poller.store.db"),
        lazy("poller.observe.logs"),
        lazy("poller.observe.otel"),
    )
    processes, sending = lazy("poller.service.processes"), lazy("poller.deliver.sending")
    service = lazy("poller.service.runner")

T = TypeVar("T")
MAX_PROCESSES = 256  # `--processes`
FLUSH_SPANS = 5.0  # seconds a graceful stop gives the exporter
EXIT_CRASHED = 70  # EX_SOFTWARE: a loop crashed; the poller stopped gracefully, restart it


GC_THRESHOLDS = (10_000, 20, 100)
"""The cyclic collector's thresholds in a service process (Python's are 700, 10, 10).
A delivery allocates dozens of short-lived objects that reference counting frees;
at Python's thresholds the collector ran every few deliveries, and walked the whole
heap (SQLAlchemy's, the modules') every few thousand: the poller spent 3 % less CPU
per delivery with these (``loadtest.overhead --wire``, interleaved)."""


async def run_service(settings: Settings, url: str, poller_id: str) -> None:
    gc.set_threshold(*GC_THRESHOLDS)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    signals = {"count": 0}

    def on_signal(signum: int) -> None:
        signals["count"] += 1
        if signals["count"] > 1:
            logging.getLogger("poller").warning("second signal: exiting now")
            os._exit(130)
        logging.getLogger("poller").info("%s: stopping gracefully", signal.Signals(signum).name)
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)
    engine = db.poller_engine(url, settings, pool_size=4, max_overflow=4)
    sender = sending.make_sender(settings)
    telemetry = otel.setup()  # OTEL_EXPORTER_OTLP_ENDPOINT… (poller/observe/otel.py); else None
    if telemetry is not None:
        telemetry.start_exporting()
    ready: asyncio.Future[Poller] = loop.create_future()
    helpers: list[asyncio.Task[None]] = []
    if processes.ENV_SUPERVISOR in os.environ:  # a child of `poller run --processes N`
        helpers.append(asyncio.create_task(processes.watch_supervisor(stop)))
        helpers.append(asyncio.create_task(_report_port(ready)))
    try:
        await service.serve(
            settings,
            engine=engine,
            sender=sender,
            database_url=url,
            poller_id=poller_id,
            stop=stop,
            ready=ready,
            telemetry=telemetry,
        )
    finally:
        for helper in helpers:
            helper.cancel()
        await sender.aclose()
        if telemetry is not None:  # export the spans queued, for a bounded time
            await telemetry.close(FLUSH_SPANS)
        await engine.dispose()


async def _report_port(ready: asyncio.Future[Poller]) -> None:
    poller = await ready
    if poller.ops_port is not None:
        try:
            processes.write_port(poller.ops_port)
        except OSError as exc:  # its supervisor is gone (the directory with it), or the disk
            logging.getLogger("poller").warning("cannot tell the supervisor my port: %s", exc)


def _cores() -> int:
    """The cores this process may run on (``--processes auto``)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


class _Processes(click.ParamType[int]):
    name = "N|auto"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        if str(value).strip().lower() == "auto":
            return _cores()
        try:
            count = int(value)
        except ValueError:
            self.fail(f"{value!r} is not a whole number or 'auto'", param, ctx)
        if not 1 <= count <= MAX_PROCESSES:
            self.fail(f"{count} is not between 1 and {MAX_PROCESSES}", param, ctx)
        return count


@click.command()
@click.option("--id", "poller_id", help="Poller name (default: host-pid).")
@click.option("--shards", type=int, help="Overrides POLLER_SHARDS.")
@click.option("--concurrency", type=int, help="Overrides POLLER_CONCURRENCY (per process).")
@click.option(
    "--processes",
    "count",
    type=_Processes(),
    default=1,
    show_default=True,
    help="Poller processes on this host under one supervisor; 'auto' = the cores usable.",
)
def run(poller_id: str | None, shards: int | None, concurrency: int | None, count: int) -> None:
    """Deliver messages until SIGTERM/SIGINT (graceful), a second signal exits at once."""
    settings, url = settings_and_url()
    given = (("shards", shards), ("concurrency", concurrency))
    overrides = {k: v for k, v in given if v is not None}  # 0 is a value, and is refused
    if overrides:
        from poller.settings import load_settings

        settings = load_settings(**{**settings.model_dump(), **overrides})
    name = poller_id or f"{socket.gethostname()}-{os.getpid()}"
    logs.configure(settings.log_format, poller_id=name)
    if count > 1:
        env = {**os.environ, "POLLER_DATABASE_URL": url}
        env.update({f"POLLER_{k.upper()}": str(v) for k, v in overrides.items()})
        # The supervisor's PID in every child's name: children orphaned by a killed
        # supervisor still drain while its replacement starts, and two live pollers
        # must never share a name (an election owner).
        base = f"{poller_id}-{os.getpid()}" if poller_id else name
        fleet = processes.Fleet(
            count,
            base=base,
            env=env,
            metrics_addr=settings.metrics_addr,
            hung_after=settings.child_hung_after,
        )
        logging.getLogger("poller").info("poller %s starting %d processes", name, count)
        sys.exit(event_loop_run(fleet.run()))
    settings = _open_files_for(settings)
    logging.getLogger("poller").info(
        "poller %s starting (HTTP client %s)", name, settings.http_client
    )
    if settings.proxy is not None:  # its password never: poller/deliver/proxy.py
        logging.getLogger("poller").info("deliveries go through the proxy %s", settings.proxy.shown)
    try:
        event_loop_run(run_service(settings, url, name))
    except ServiceCrashed as exc:
        logging.getLogger("poller").critical("poller %s stopped after a crash: %s", name, exc)
        sys.exit(EXIT_CRASHED)


FILES_BESIDE_SOCKETS = 256  # the database pool, LISTEN, the metrics server, logs, imports


def _open_files_for(settings: Settings) -> Settings:
    """Room for a socket per delivery (POLLER_CONCURRENCY + POLLER_MAX_WAITING): the soft
    limit on open files is raised as far as the hard one allows (1,024 is a common
    default), and where even that is short, fewer deliveries may wait, said once."""
    import resource

    needed = settings.concurrency + settings.max_waiting + FILES_BESIDE_SOCKETS
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        raised = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            soft = raised
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return settings
    fits = max(soft - settings.concurrency - FILES_BESIDE_SOCKETS, 0)
    logging.getLogger("poller").warning(
        "open files are limited to %d here (ulimit -n): at most %d deliveries wait for "
        "slow receivers instead of POLLER_MAX_WAITING=%d",
        soft,
        fits,
        settings.max_waiting,
    )
    return settings.model_copy(update={"max_waiting": fits})


def event_loop_run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on uvloop when it is installed (faster), else asyncio's loop."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - platforms without uvloop
        return asyncio.run(coro)
    return uvloop.run(coro)
