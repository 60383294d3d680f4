"""Redis as the election backend, stopped and restarted under load (its own server)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import Engine, text

from poller.local.embedded import EmbeddedRedis
from tests.conftest import make_endpoint
from tests.integration.helpers import seed, wait_for
from tests.integration.service_helpers import (
    counts,
    fast_settings,
    running_poller,
    running_receiver,
)


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _fences(engine: Engine) -> dict[int, int]:
    with engine.connect() as conn:
        return dict(conn.execute(text("SELECT shard, fence FROM poller_shard_fences")).all())


@pytest.mark.slow
async def test_fail_open_keeps_delivering_and_leases_resume(
    engine: Engine, db_url: str, own_redis: EmbeddedRedis
) -> None:
    total = 3000
    async with running_receiver() as (receiver, url):
        make_endpoint(engine, "a", url=url)
        settings = fast_settings(election="redis", redis_url=own_redis.url(), shards=4)
        async with running_poller(db_url, settings) as poller:
            assert poller.shards is not None
            await wait_for(_leads(poller, 4), timeout=10)
            before = _fences(engine)
            await asyncio.to_thread(own_redis.stop)

            async def failed_open() -> bool:
                return poller.shards is not None and not poller.shards.backend_ok

            await wait_for(failed_open, timeout=10)
            assert REGISTRY.get_sample_value("webhook_poller_election_backend_up") == 0
            seed(engine, total, "a")  # enqueued while Redis is down

            async def delivered() -> bool:
                return counts(engine) == {"delivered": total}

            await wait_for(delivered, timeout=60)
            await asyncio.to_thread(own_redis.start)  # back, with every key gone

            async def recovered() -> bool:
                return poller.shards is not None and poller.shards.backend_ok

            await wait_for(recovered, timeout=10)
            assert REGISTRY.get_sample_value("webhook_poller_election_backend_up") == 1
            await wait_for(_leads(poller, 4), timeout=10)
            after = _fences(engine)
    assert receiver.stats.applied == total
    # Redis lost its counters, yet PostgreSQL saw every fence grow.
    assert all(after[s] > before[s] for s in before), (before, after)


def _leads(poller, n: int):  # type: ignore[no-untyped-def]
    async def check() -> bool:
        return (
            poller.shards is not None
            and poller.shards.backend_ok
            and (len(poller.shards.held) == n)
        )

    return check


@pytest.mark.slow
async def test_fail_closed_stops_claiming_until_redis_returns(
    engine: Engine, db_url: str, own_redis: EmbeddedRedis
) -> None:
    async with running_receiver() as (receiver, url):
        make_endpoint(engine, "a", url=url)
        settings = fast_settings(
            election="redis", redis_url=own_redis.url(), shards=2, election_fail="closed"
        )
        async with running_poller(db_url, settings) as poller:
            await wait_for(_leads(poller, 2), timeout=10)
            await asyncio.to_thread(own_redis.stop)

            async def closed() -> bool:
                return poller.shards is not None and poller.shards.scope().buckets == ()

            await wait_for(closed, timeout=10)
            # A claim that read the scope just before it closed may still be on its way
            # (its fences are good in PostgreSQL: nobody else took the shards); two more
            # claim cycles and every claim from here on reads the closed scope.
            cycles = poller.claimer.cycles

            async def claimed_closed() -> bool:
                return poller.claimer.cycles >= cycles + 2

            await wait_for(claimed_closed, timeout=10)
            seed(engine, 100, "a")
            await asyncio.sleep(1.0)  # a window in which nothing may be claimed
            assert counts(engine) == {"pending": 100} and receiver.stats.received == 0
            await asyncio.to_thread(own_redis.start)

            async def delivered() -> bool:
                return counts(engine) == {"delivered": 100}

            await wait_for(delivered, timeout=20)
