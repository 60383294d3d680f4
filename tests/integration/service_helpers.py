"""Run a Poller and a Receiver in the test's event loop."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

from sqlalchemy import Engine, text

from poller.deliver.sending import make_sender
from poller.election import Elector
from poller.local.receiver import Faults, Receiver
from poller.rows.events import EventHook
from poller.service.runner import Poller, serve
from poller.settings import Settings, load_settings
from poller.store.db import poller_engine

FAST: dict[str, Any] = {
    "retry_schedule": [0.05],
    "request_timeout": 1.0,
    "claim_lease": 3.0,
    "poll_interval": 0.2,
    "sweep_interval": 0.2,
    "lease_ttl": 1.5,
    "allow_private_targets": True,
    "shutdown_grace": 2.0,
    "circuit_cooldown": 0.2,
    "circuit_cooldown_max": 0.5,
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
async def serving(
    db_url: str,
    settings: Settings,
    poller_id: str = "p1",
    elector: Elector | None = None,
    on_event: Sequence[EventHook] = (),
) -> AsyncIterator[tuple[Poller, asyncio.Task[Poller]]]:
    """serve() in this event loop: the running Poller and its task (which may crash)."""
    engine = poller_engine(db_url, settings, pool_size=4)
    sender = make_sender(settings)
    stop = asyncio.Event()
    ready: asyncio.Future[Poller] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(
        serve(
            settings,
            engine=engine,
            sender=sender,
            database_url=db_url,
            poller_id=poller_id,
            stop=stop,
            elector=elector,
            ready=ready,
            on_event=on_event,
        )
    )
    try:
        await asyncio.wait([ready, task], timeout=20, return_when=asyncio.FIRST_COMPLETED)
        if task.done() and not ready.done():
            await task  # raises the startup error
        yield ready.result(), task
    finally:
        stop.set()
        # A crash is the caller's to see (running_poller re-raises it); a startup error
        # was raised above already. Either way: close the sender and engine below.
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, timeout=30)
        await sender.aclose()
        await engine.dispose()


@contextlib.asynccontextmanager
async def running_poller(
    db_url: str,
    settings: Settings,
    poller_id: str = "p1",
    elector: Elector | None = None,
    on_event: Sequence[EventHook] = (),
) -> AsyncIterator[Poller]:
    """A whole poller (shard manager included) in this event loop; stopped gracefully."""
    async with serving(db_url, settings, poller_id, elector, on_event) as (poller, task):
        yield poller
    if not task.cancelled() and task.exception() is not None:
        raise task.exception()  # type: ignore[misc]


def counts(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT status, count(*) FROM poller_outbox GROUP BY status"))
        return {status: n for status, n in rows}


class CycleWatch:
    """Counts a poller's claim cycles from now on (the claimer's on_cycle hook): wait for
    cycles to have run instead of sleeping and hoping one did."""

    def __init__(self, poller: Poller) -> None:
        self.cycles = 0
        self.claimed = 0
        self._ran = asyncio.Event()
        poller.claimer.on_cycle.append(self._on_cycle)

    def _on_cycle(self, claimed: int) -> None:
        self.cycles += 1
        self.claimed += claimed
        self._ran.set()

    async def wait(self, cycles: int, timeout: float = 10.0) -> None:
        """Until ``cycles`` more claim cycles have run."""
        target = self.cycles + cycles
        async with asyncio.timeout(timeout):
            while self.cycles < target:
                self._ran.clear()
                await self._ran.wait()
