"""Helpers of the endpoint-health tests (test_health_*.py): reading an endpoint's health,
a breaker's claims, a receiver that keeps the bodies it applied."""

from __future__ import annotations

import contextlib
import itertools
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from click.testing import CliRunner
from sqlalchemy import Engine, text

from poller.cli import cli
from poller.local.receiver import Receiver
from poller.rows.claims import Claims
from poller.rules import outcomes
from poller.rules.outcomes import ClaimedMessage


def health(engine: Engine, name: str = "billing") -> Any:
    with engine.connect() as conn:
        return conn.execute(
            text(
                "SELECT h.*, e.paused_until, e.enabled, e.disabled_reason "
                "FROM poller_endpoint_health h "
                "JOIN poller_endpoints e ON e.id = h.endpoint_id WHERE e.name = :n"
            ),
            {"n": name},
        ).one()


def age_first_hundred(engine: Engine) -> None:
    """The first 100 messages an hour old and due an hour ago; every 50th of them is to
    be looked up first (an earlier outcome unknown)."""
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE poller_outbox SET created_at = created_at - interval '1 hour', "
                "next_attempt_at = now() - interval '1 hour', "
                "needs_lookup = (id % 50 = 0) "
                "WHERE id IN (SELECT id FROM poller_outbox ORDER BY id LIMIT 100)"
            )
        )


def attempts_spent(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT sum(attempts) FROM poller_outbox")).scalar_one())


def ending_gaps(engine: Engine) -> list[float]:
    """The seconds between one message's last write and the next's, sorted (the median
    judges a pace: a loaded machine's stalls move it less than a run's whole time)."""
    with engine.connect() as conn:
        ended = conn.execute(
            text("SELECT extract(epoch FROM updated_at) FROM poller_outbox ORDER BY 1")
        ).scalars()
        times = [float(t) for t in ended]
    return sorted(b - a for a, b in itertools.pairwise(times))


def failing(msg: ClaimedMessage, status: int | None = 500) -> outcomes.Outcome:
    error_class = None if status else "ConnectError"
    return outcomes.retry(msg, 0, status_code=status, error_class=error_class, error_message="down")


async def claim(breaker: Claims, limit: int = 100) -> list[ClaimedMessage]:
    return await breaker.claim_batch(limit=limit, governed=True)


async def claim_within(breaker: Claims, seconds: float = 5.0) -> list[ClaimedMessage]:
    deadline = time.monotonic() + seconds
    while not (batch := await claim(breaker)):
        assert time.monotonic() < deadline, "nothing became claimable"
    return batch


def dataclass_replace(outcome: outcomes.Outcome, **changes: Any) -> outcomes.Outcome:
    import dataclasses

    return dataclasses.replace(outcome, **changes)


class Recording(Receiver):
    """A receiver that keeps every applied body (operational events)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.bodies: list[dict[str, Any]] = []

    def _apply(
        self, key: str, body: bytes, now: float, headers: dict[bytes, bytes] | None = None
    ) -> None:
        if key not in self.applied:
            self.bodies.append(json.loads(body))
        super()._apply(key, body, now, headers)


@contextlib.asynccontextmanager
async def recording(secret: str) -> AsyncIterator[tuple[Recording, str]]:
    receiver = Recording(keys=[secret])
    port = await receiver.start()
    try:
        yield receiver, f"http://127.0.0.1:{port}"
    finally:
        await receiver.stop()


def cli_run(db_url: str, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(
        cli, list(args), env={"POLLER_DATABASE_URL": db_url, "POLLER_ELECTION": "postgres"}
    )
    return result.exit_code, result.output
