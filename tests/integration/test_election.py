"""Election in action: stale leaders fenced by PostgreSQL, balance, split brain, none."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import AsyncEngine

from poller.claim.shards import ShardManager, check_cluster
from poller.election import Lease
from poller.election.none import NoElector
from poller.election.postgres import PostgresElector
from poller.rows.claims import Claims
from poller.service.runner import Poller
from tests.conftest import make_endpoint
from tests.integration.helpers import seed, wait_for
from tests.integration.service_helpers import (
    counts,
    fast_settings,
    running_poller,
    running_receiver,
)


@pytest.mark.parametrize("alone", [False, True], ids=["in a transaction", "on its own"])
async def test_a_superseded_leader_claims_nothing(
    aengine: AsyncEngine, engine: Engine, alone: bool
) -> None:
    """Both ways to claim check the fences: FENCE_SHARDS in the claim's transaction,
    or CLAIM_BATCH itself when the claim is one statement (an endpoint cache given)."""
    ep = make_endpoint(engine, "a").endpoint
    seed(engine, 10, "a")
    await check_cluster(aengine, 4)
    shard = ep.bucket % 4
    old = ShardManager(PostgresElector(aengine, "old"), aengine, shards=4, lease_ttl=0.5)
    new = ShardManager(PostgresElector(aengine, "new"), aengine, shards=4, lease_ttl=30)
    await old.tick()
    stale_scope = old.scope()
    assert stale_scope.fences is not None and shard in stale_scope.fences

    async def taken_over() -> bool:
        await new.tick()
        return shard in new.held

    await wait_for(taken_over, timeout=10)  # after the old lease's TTL
    refused: list[int] = []
    cache: dict[int, Any] | None = {} if alone else None
    claims = Claims(aengine, poller_id="old", claim_lease=30)
    got = await claims.claim(
        10,
        stale_scope.buckets,
        fences=stale_scope.fences,
        shards=4,
        on_refused=refused.extend,
        endpoint_versions=cache,
    )
    assert got.messages == [] and shard in refused  # PostgreSQL refused the old fence
    assert claims.stale_leader_claims >= 1
    fresh = new.scope()
    newer = Claims(aengine, poller_id="new", claim_lease=30)
    got = await newer.claim(
        10, fresh.buckets, fences=fresh.fences, shards=4, endpoint_versions=cache
    )
    assert len(got.messages) == 10
    assert [e.id for e in got.endpoints] == [ep.id]  # read for the cache
    await claims.close()
    await newer.close()


async def _holdings(pollers: list[Poller]) -> list[int]:
    return sorted(len(p.shards.held) if p.shards else 0 for p in pollers)


@contextlib.asynccontextmanager
async def _pollers(db_url: str, n: int, **settings: object) -> AsyncIterator[list[Poller]]:
    async with contextlib.AsyncExitStack() as stack:
        pollers = [
            await stack.enter_async_context(
                running_poller(db_url, fast_settings(**settings), poller_id=f"p{i}")
            )
            for i in range(n)
        ]
        yield pollers


async def test_three_pollers_balance_eight_shards_and_cover_a_leaver(db_url: str) -> None:
    settings = {"shards": 8, "lease_ttl": 3.0}
    async with _pollers(db_url, 2, **settings) as pollers:
        async with running_poller(db_url, fast_settings(**settings), poller_id="p9") as third:
            everyone = [*pollers, third]

            async def balanced() -> bool:
                return await _holdings(everyone) == [2, 3, 3]

            await wait_for(balanced, timeout=20)
        began = time.monotonic()  # p9 stopped gracefully and released its leases

        async def covered() -> bool:
            return await _holdings(pollers) == [4, 4]

        await wait_for(covered, timeout=10)
        assert time.monotonic() - began < 3.0  # not after the TTL: at the next tick


class SplitBrain(NoElector):
    """Every poller believes it leads every shard, with the same fence: fenced claims all
    pass, so only SKIP LOCKED and the claim tokens keep the rows safe."""

    fenced = True

    async def acquire(self, key: str, ttl: float, floor: int = 0) -> Lease | None:
        return Lease(key, self.owner, floor + 1, time.monotonic(), ttl)

    async def renew(self, lease: Lease) -> Lease | None:
        return Lease(lease.key, self.owner, lease.fence, time.monotonic(), lease.ttl)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["none", "split-brain"])
async def test_no_loss_no_double_flight_without_a_single_leader(
    engine: Engine, db_url: str, mode: str
) -> None:
    total = 10_000  # the suite's time budget: make chaos runs the long contests
    async with running_receiver() as (receiver, url):
        make_endpoint(engine, "a", url=url, max_in_flight=64)
        seed(engine, total, "a")
        async with contextlib.AsyncExitStack() as stack:
            for n in range(2):
                # A lease longer than any stall of this shared loop: a row whose lease ran
                # out is reclaimed and sent again by design (at least once), which is not
                # the double flight this test looks for (a 3 s lease on a machine busy
                # with other work: 64 such duplicates in 10,000).
                settings = fast_settings(
                    election="none" if mode == "none" else "postgres",
                    concurrency=64,
                    claim_lease=30.0,
                )
                elector = SplitBrain(f"p{n}") if mode == "split-brain" else None
                await stack.enter_async_context(
                    running_poller(db_url, settings, poller_id=f"p{n}", elector=elector)
                )

            async def done() -> bool:
                return counts(engine) == {"delivered": total}

            await wait_for(done, timeout=120)
    assert receiver.stats.applied == total  # 0 lost
    assert receiver.stats.duplicates == 0  # never in flight at two pollers at once
    with engine.connect() as conn:
        per_poller = dict(
            conn.execute(text("SELECT claimed_by, count(*) FROM poller_outbox GROUP BY 1")).all()
        )
        claims = conn.execute(text("SELECT max(attempts) FROM poller_outbox")).scalar_one()
    assert claims == 1 and len(per_poller) == 2  # both worked, each row claimed once


async def test_lease_holdings_show_each_shard(aengine: AsyncEngine, engine: Engine) -> None:
    from poller.claim.shards import lease_holdings

    await check_cluster(aengine, 2)
    elector = PostgresElector(aengine, "p1")
    manager = ShardManager(elector, aengine, shards=2, lease_ttl=30)
    await manager.tick()
    rows = await lease_holdings(elector, aengine)
    assert [(r.key, r.holder) for r in rows] == [
        ("shard:0", "p1"),
        ("shard:1", "p1"),
        ("maintenance", "p1"),
    ]
    assert all(r.expires_in and r.expires_in > 25 for r in rows)
    assert rows[0].fence == rows[0].accepted_fence


async def test_shard_count_is_agreed_even_when_pollers_start_together(db_url: str) -> None:
    from poller.errors import ConfigurationError
    from poller.store.db import async_engine

    engines = [async_engine(db_url) for _ in range(8)]
    try:
        for e in engines:  # connected beforehand, so the eight really race
            async with e.connect() as conn:
                await conn.execute(text("SELECT 1"))
        await asyncio.gather(*(check_cluster(e, 8) for e in engines))
        with pytest.raises(ConfigurationError, match=r"POLLER_SHARDS=4.*use 8 shards"):
            await check_cluster(engines[0], 4)
        with pytest.raises(ConfigurationError, match=r"POLLER_ELECTION=redis.*'postgres'"):
            await check_cluster(engines[0], 8, "redis")  # each would lead every shard
    finally:
        for e in engines:
            await e.dispose()
