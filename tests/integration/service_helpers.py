"""Run a Poller and a Receiver in the test's event loop."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from sqlalchemy import Engine, text

from poller.cli.run import make_sender
from poller.db import async_engine
from poller.receiver import Faults, Receiver
from poller.service import Poller
from poller.settings import Settings, load_settings

FAST: dict[str, Any] = {
    "retry_schedule": [0.05],
    "request_timeout": 1.0,
    "claim_lease": 3.0,
    "poll_interval": 0.2,
    "sweep_interval": 0.2,
    "allow_private_targets": True,
    "shutdown_grace": 2.0,
}


def fast_settings(**overrides: Any) -> Settings:
    return load_settings(**{**FAST, **overrides})


@contextlib.asynccontextmanager
async def running_receiver(faults: Faults | None = None) -> AsyncIterator[tuple[Receiver, str]]:
    receiver = Receiver(faults=faults or Faults())
    port = await receiver.start()
    try:
        yield receiver, f"http://127.0.0.1:{port}"
    finally:
        await receiver.stop()


@contextlib.asynccontextmanager
async def running_poller(
    db_url: str, settings: Settings, poller_id: str = "p1"
) -> AsyncIterator[Poller]:
    engine = async_engine(db_url, pool_size=4)
    sender = make_sender(settings)
    poller = Poller(
        settings, engine=engine, sender=sender, database_url=db_url, poller_id=poller_id
    )
    stop = asyncio.Event()
    task = asyncio.create_task(poller.run(stop))
    try:
        yield poller
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=30)
        await sender.aclose()
        await engine.dispose()


def counts(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT status, count(*) FROM poller_outbox GROUP BY status"))
        return {status: n for status, n in rows}
