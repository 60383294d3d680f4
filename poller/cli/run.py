"""``poller run``: the delivery service, with signal handling and the HTTP sender."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
from collections.abc import Coroutine
from typing import Any, TypeVar

import click

from poller import logs
from poller.cli.common import settings_and_url
from poller.db import poller_engine
from poller.senders import make_sender
from poller.service import serve
from poller.settings import Settings
from poller.supervise import ServiceCrashed

T = TypeVar("T")
EXIT_CRASHED = 70  # EX_SOFTWARE: a loop crashed; the poller stopped gracefully, restart it


async def run_service(settings: Settings, url: str, poller_id: str) -> None:
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
    engine = poller_engine(url, settings, pool_size=4, max_overflow=4)
    sender = make_sender(settings)
    try:
        await serve(
            settings, engine=engine, sender=sender, database_url=url, poller_id=poller_id, stop=stop
        )
    finally:
        await sender.aclose()
        await engine.dispose()


@click.command()
@click.option("--id", "poller_id", help="Poller name (default: host-pid).")
@click.option("--shards", type=int, help="Overrides POLLER_SHARDS.")
@click.option("--concurrency", type=int, help="Overrides POLLER_CONCURRENCY.")
def run(poller_id: str | None, shards: int | None, concurrency: int | None) -> None:
    """Deliver messages until SIGTERM/SIGINT (graceful), a second signal exits at once."""
    settings, url = settings_and_url()
    given = (("shards", shards), ("concurrency", concurrency))
    overrides = {k: v for k, v in given if v is not None}  # 0 is a value, and is refused
    if overrides:
        from poller.settings import load_settings

        settings = load_settings(**{**settings.model_dump(), **overrides})
    logs.configure(settings.log_format)
    name = poller_id or f"{socket.gethostname()}-{os.getpid()}"
    logging.getLogger("poller").info("poller %s starting", name)
    try:
        event_loop_run(run_service(settings, url, name))
    except ServiceCrashed as exc:
        logging.getLogger("poller").critical("poller %s stopped after a crash: %s", name, exc)
        sys.exit(EXIT_CRASHED)


def event_loop_run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on uvloop when it is installed (faster), else asyncio's loop."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - platforms without uvloop
        return asyncio.run(coro)
    return uvloop.run(coro)
