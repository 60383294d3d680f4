"""Shared setup for integration tests: seeding rows fast, reading them back."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy import Engine, select, text
from sqlalchemy.orm import Session

from poller import Message, enqueue_many
from poller.store.schema import delivery_attempts, outbox


def seed(engine: Engine, n: int, endpoint: str = "billing", **fields: Any) -> list[int]:
    """Enqueue ``n`` due messages through the public API; return their ids."""
    ids: list[int] = []
    for start in range(0, n, 5000):
        batch = [
            Message(endpoint, "test.event", {"n": i}, f"{endpoint}:{i}", **fields)
            for i in range(start, min(n, start + 5000))
        ]
        with Session(engine) as session, session.begin():
            ids += enqueue_many(session, batch)
    return ids


def row(engine: Engine, msg_id: int) -> Any:
    with engine.connect() as conn:
        return conn.execute(select(outbox).where(outbox.c.id == msg_id)).one()


def attempts_of(engine: Engine, msg_id: int) -> list[Any]:
    with engine.connect() as conn:
        query = (
            select(delivery_attempts)
            .where(delivery_attempts.c.message_id == msg_id)
            .order_by(delivery_attempts.c.id)
        )
        return list(conn.execute(query).all())


def expire_claims(engine: Engine) -> None:
    """Move every claim's expiry into the past (as if the lease ran out)."""
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE poller_outbox SET claim_expires_at = now() - interval '1 second' "
                "WHERE status = 'in_flight'"
            )
        )


def make_due(engine: Engine) -> None:
    """Make every pending row due now (skip its retry delay)."""
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE poller_outbox SET next_attempt_at = now() WHERE status = 'pending'")
        )


async def wait_for(
    condition: Callable[[], Awaitable[bool] | bool], timeout: float = 10.0, interval: float = 0.02
) -> None:
    """Poll ``condition`` (a coroutine function, or a plain one) until it holds; fail after
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not await _holds(condition):
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        await asyncio.sleep(interval)


async def _holds(condition: Callable[[], Awaitable[bool] | bool]) -> bool:
    held = condition()
    return bool(await held) if inspect.isawaitable(held) else bool(held)
