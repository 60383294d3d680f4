"""The circuit breaker (poller/health.py): open after N failed sends, claim nothing and
spend no attempt while open, one probe after the cool-down, close on success."""

from __future__ import annotations

import time
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import AsyncEngine

from poller import claims
from poller.claims import Claims
from poller.health import Circuit
from poller.receiver import Faults
from tests.conftest import make_endpoint
from tests.integration.helpers import seed, wait_for
from tests.integration.service_helpers import (
    counts,
    fast_settings,
    running_poller,
    running_receiver,
)


def health(engine: Engine, name: str = "billing") -> Any:
    with engine.connect() as conn:
        return conn.execute(
            text(
                "SELECT h.* FROM poller_endpoint_health h "
                "JOIN poller_endpoints e ON e.id = h.endpoint_id WHERE e.name = :n"
            ),
            {"n": name},
        ).one()


def attempts_spent(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT sum(attempts) FROM poller_outbox")).scalar_one())


@pytest.fixture
def breaker(aengine: AsyncEngine) -> Claims:
    return Claims(
        aengine,
        poller_id="p1",
        claim_lease=30,
        circuit=Circuit(failures=3, cooldown=0.3, cooldown_max=0.6),
    )


def _failing(status: int | None) -> Any:
    return lambda m: claims.retry(m, 0, status_code=status, error_message="down")


async def test_failed_sends_open_the_circuit_and_a_probe_closes_it(
    engine: Engine, breaker: Claims
) -> None:
    make_endpoint(engine, "billing", max_attempts=10)
    seed(engine, 10)
    first = await breaker.claim_batch(limit=2)
    await breaker.complete([_failing(500)(m) for m in first])
    assert health(engine).state == "closed" and health(engine).consecutive_failures == 2
    second = await breaker.claim_batch(limit=1)
    await breaker.complete([_failing(None)(m) for m in second])  # no answer: counts too
    opened = health(engine)
    assert (opened.state, opened.opens, opened.cooldown) == ("open", 1, 0.3)

    spent = attempts_spent(engine)
    assert await breaker.claim_batch(limit=100) == []  # open: nothing claimed, nothing spent
    assert attempts_spent(engine) == spent

    deadline = time.monotonic() + 5
    while not (probe := await breaker.claim_batch(limit=100)):
        assert time.monotonic() < deadline
    assert len(probe) == 1 and health(engine).state == "half_open"  # one message: the probe
    assert await breaker.claim_batch(limit=100) == []
    await breaker.complete([_failing(503)(probe[0])])
    reopened = health(engine)
    assert (reopened.state, reopened.opens, reopened.cooldown) == ("open", 2, 0.6)  # doubled

    deadline = time.monotonic() + 5
    while not (probe := await breaker.claim_batch(limit=100)):
        assert time.monotonic() < deadline
    await breaker.complete([claims.delivered(probe[0], status_code=200)])
    closed = health(engine)
    assert (closed.state, closed.consecutive_failures, closed.cooldown) == ("closed", 0, None)
    assert len(await breaker.claim_batch(limit=100)) == 9  # the backlog drains


async def test_a_4xx_answer_is_not_a_failed_endpoint(engine: Engine, breaker: Claims) -> None:
    make_endpoint(engine, "billing", max_attempts=10)
    seed(engine, 5)
    batch = await breaker.claim_batch(limit=5)
    await breaker.complete([claims.failed(m, status_code=400) for m in batch])
    assert (health(engine).state, health(engine).consecutive_failures) == ("closed", 0)


async def test_off_by_default_the_count_is_kept_but_never_opens(
    engine: Engine, aengine: AsyncEngine
) -> None:
    plain = Claims(aengine, poller_id="p1", claim_lease=30)
    make_endpoint(engine, "billing", max_attempts=10)
    seed(engine, 30)
    batch = await plain.claim_batch(limit=30)
    await plain.complete([_failing(500)(m) for m in batch])
    assert (health(engine).state, health(engine).consecutive_failures) == ("closed", 30)


async def test_a_down_endpoint_gets_a_handful_of_probes_not_thousands(
    engine: Engine, db_url: str
) -> None:
    """5,000 messages to an endpoint that is down, then back: while down the receiver
    sees the sends that opened the circuit and a few probes; after, all are delivered."""
    faults = Faults(fail_rate=1.0, status=503)
    async with running_receiver(faults) as (receiver, url):
        make_endpoint(engine, "billing", url=url, max_attempts=10, max_in_flight=8)
        seed(engine, 5000)
        settings = fast_settings(circuit_failures=5, circuit_cooldown=0.2, circuit_cooldown_max=0.5)
        async with running_poller(db_url, settings):

            async def opened_twice() -> bool:
                return health(engine).opens >= 3

            await wait_for(opened_twice, timeout=20)
            down = receiver.stats.received
            assert down < 60, down  # 5 to open + up to 8 in flight, + probes
            assert attempts_spent(engine) == down  # every attempt was a request
            faults.fail_rate = 0.0  # the endpoint is back

            async def delivered() -> bool:
                return counts(engine).get("delivered", 0) == 5000

            await wait_for(delivered, timeout=60, interval=0.1)
    assert receiver.stats.applied == 5000 and health(engine).state == "closed"
