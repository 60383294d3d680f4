"""Crash-only supervision of the service's long-lived loops (G11, docs/explanation/guarantees.md).

Every loop of a poller — claimer, completer, lease keeper, listener,
maintenance services, shard manager — runs under one :class:`Supervisor`.
A loop handles the errors it expects (a database that is away, an election
backend that is down) itself, with backoff. Anything else that escapes it is a
bug or a state nobody planned for, and the poller must not carry on half
alive (claiming nothing while ``/healthz`` says ok). So the first loop to
crash — or to return while the poller is not stopping —:

1. is logged with its traceback and counted (``webhook_poller_loop_crashes_total``);
2. turns ``/healthz`` and ``/readyz`` unhealthy (503, naming the loop);
3. stops the poller the graceful way: no new claims, in-flight deliveries
   finish or are released, outcomes written, leases released;
4. makes ``serve()`` raise :class:`ServiceCrashed`, so ``poller run`` exits
   non-zero (70) and its supervisor (systemd, Kubernetes) restarts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Coroutine
from typing import Any

from poller.errors import ServiceCrashed
from poller.observe import metrics

log = logging.getLogger("poller.service.supervise")


class Supervisor:
    """Named tasks, of which the first to fail stops the whole poller."""

    def __init__(self) -> None:
        self.stopping = asyncio.Event()
        self.failure: str | None = None
        self._tasks: dict[str, asyncio.Task[Any]] = {}

    @property
    def healthy(self) -> bool:
        return self.failure is None

    def spawn(self, name: str, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro, name=name)
        self._tasks[name] = task
        task.add_done_callback(functools.partial(self._done, name))
        return task

    def stop(self) -> None:
        """Begin a graceful stop (a signal, or the caller's stop event)."""
        self.stopping.set()

    def fail(self, name: str, exc: BaseException) -> None:
        """Record a crash (the first one names the failure) and stop the poller."""
        metrics.LOOP_CRASHES.labels(name).inc()
        if self.failure is None:
            self.failure = f"{name} crashed: {type(exc).__name__}: {exc}"[:500]
            log.critical(
                "%s crashed; stopping this poller so it can be restarted",
                name,
                exc_info=exc,
                extra={"loop": name},
            )
        self.stopping.set()

    def _done(self, name: str, task: asyncio.Task[Any]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is None and not self.stopping.is_set():
            exc = RuntimeError(f"{name} returned while the poller was running")
        if exc is not None:
            self.fail(name, exc)

    async def cancel(self, *names: str) -> None:
        """Cancel the named tasks (all, if none named) and wait for them to end."""
        tasks = [t for n, t in self._tasks.items() if not names or n in names]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    def raise_if_failed(self) -> None:
        if self.failure is not None:
            raise ServiceCrashed(self.failure)
