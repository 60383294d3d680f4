"""One contract, every election backend (as River's driver suite is shared by every driver)."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Callable

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from poller.election import Elector
from poller.election.postgres import PostgresElector
from poller.election.redis import RedisElector

_prefixes = itertools.count()
Factory = Callable[[str], Elector]


@pytest.fixture(params=["redis", "postgres"])
async def make(
    request: pytest.FixtureRequest, redis_url: str, aengine: AsyncEngine
) -> AsyncIterator[Factory]:
    made: list[Elector] = []
    prefix = f"test{next(_prefixes)}-{time.time_ns()}:"

    def factory(owner: str) -> Elector:
        elector: Elector = (
            RedisElector(redis_url, owner, prefix=prefix)
            if request.param == "redis"
            else PostgresElector(aengine, owner)
        )
        made.append(elector)
        return elector

    yield factory
    for elector in made:
        await elector.close()


async def test_one_holder_at_a_time(make: Factory) -> None:
    a, b = make("a"), make("b")
    lease = await a.acquire("shard:0", ttl=30)
    assert lease is not None and lease.owner == "a"
    assert await b.acquire("shard:0", ttl=30) is None
    assert await a.acquire("shard:0", ttl=30) is not None  # re-acquiring one's own is fine
    assert [(h.key, h.owner) for h in await b.holders()] == [("shard:0", "a")]


async def test_only_the_holder_renews_or_releases(make: Factory) -> None:
    a, b = make("a"), make("b")
    lease = await a.acquire("k", ttl=30)
    assert lease is not None
    forged = type(lease)(lease.key, "b", lease.fence, lease.acquired_at, lease.ttl)
    assert await b.renew(forged) is None
    await b.release(forged)
    assert [h.owner for h in await a.holders()] == ["a"]
    renewed = await a.renew(lease)
    assert renewed is not None and renewed.fence == lease.fence
    await a.release(lease)
    assert await a.holders() == []
    assert await a.renew(lease) is None  # released: gone


async def test_fence_strictly_increases_across_takeovers(make: Factory) -> None:
    a, b = make("a"), make("b")
    fences = []
    for elector in (a, b, a, b):
        lease = await elector.acquire("k", ttl=30)
        assert lease is not None
        fences.append(lease.fence)
        await elector.release(lease)
    assert fences == sorted(set(fences))


async def test_a_lease_expires_after_its_ttl(make: Factory) -> None:
    a, b = make("a"), make("b")
    began = time.monotonic()  # before the lease began: a slow acquire cannot make it late
    lease = await a.acquire("k", ttl=0.4)
    assert lease is not None
    assert await b.acquire("k", ttl=30) is None
    taken = None
    while taken is None and time.monotonic() - began < 5:
        await asyncio.sleep(0.02)
        taken = await b.acquire("k", ttl=30)
    assert taken is not None and taken.fence > lease.fence
    assert time.monotonic() - began >= 0.3  # not before the TTL (with clock slack)
    assert await a.renew(lease) is None  # the old holder cannot extend it now


async def test_fence_exceeds_the_floor(make: Factory) -> None:
    lease = await make("a").acquire("k", ttl=30, floor=1000)
    assert lease is not None and lease.fence > 1000


async def test_members_by_heartbeat(make: Factory) -> None:
    a, b = make("a"), make("b")
    assert await a.heartbeat(ttl=30) == ["a"]
    assert await b.heartbeat(ttl=30) == ["a", "b"]
    await a.leave()
    assert await b.heartbeat(ttl=30) == ["b"]
    assert await a.heartbeat(ttl=0.2) == ["a", "b"]
    began = time.monotonic()
    while (members := await b.heartbeat(ttl=30)) != ["b"] and time.monotonic() - began < 5:
        await asyncio.sleep(0.02)
    assert members == ["b"]  # a's heartbeat ran out
    assert time.monotonic() - began >= 0.15  # and not before its TTL (with clock slack)


async def test_redis_values_written_by_hand_are_nobodys_lease(redis_url: str) -> None:
    """A lease value that is not owner|fence, a fence counter that is not a number, a key
    of another type: that shard is not taken, the others are, nothing is raised."""
    import redis.asyncio as aioredis

    prefix = f"test-garbage-{time.time_ns()}:"
    raw = aioredis.from_url(redis_url, decode_responses=True)
    try:
        await raw.set(f"{prefix}lease:shard:0", "no separator", ex=60)
        await raw.set(f"{prefix}lease:shard:1", "a|not-a-number", ex=60)
        await raw.set(f"{prefix}fence:shard:2", "garbage")
        await raw.hset(f"{prefix}lease:shard:3", "x", "y")  # WRONGTYPE for GET
        await raw.expire(f"{prefix}lease:shard:3", 60)
        a = RedisElector(redis_url, "a", prefix=prefix)
        try:
            assert await a.acquire("shard:0", ttl=30) is None
            assert await a.acquire("shard:1", ttl=30) is None  # "a" by name, but no fence
            assert await a.acquire("shard:3", ttl=30) is None
            lease = await a.acquire("shard:2", ttl=30, floor=7)
            assert lease is not None and lease.fence == 8
            shown = {h.key: (h.owner, h.fence) for h in await a.holders()}
            assert shown["shard:0"] == ("unreadable value 'no separator'", 0)
            assert shown["shard:1"] == ("unreadable value 'a|not-a-number'", 0)
            assert shown["shard:2"] == ("a", 8)
            assert shown["shard:3"] == ("unreadable value '<ResponseError>'", 0)
        finally:
            await a.close()
    finally:
        await raw.aclose()
