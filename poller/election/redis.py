"""The ``redis`` backend: ``SET NX PX`` leases, Lua renew/release, ``INCR`` fences.

Keys (under a prefix, default ``webhook-poller:``): ``lease:<key>`` holds
``<owner>|<fence>`` with a TTL; ``fence:<key>`` is a counter without expiry;
``members`` is a sorted set scored by each member's expiry in Redis's own
clock (``TIME``).

If Redis loses its keys (a restart without persistence), the counters restart
at zero. That is safe: every acquisition passes the shard's last fence
accepted by PostgreSQL as a floor, and the script lifts the counter above it
before ``INCR``, so fences stay monotonic as PostgreSQL sees them; a lease
granted without that floor would only have its claims refused.
"""

from __future__ import annotations

import time
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from poller.election import Holding, Lease
from poller.errors import ElectionUnavailable

# KEYS: lease, counter. ARGV: owner, ttl ms, floor.
# A lease value that is not ``owner|fence`` (written by hand) is someone else's: it
# is never taken over, and it does not stop the other shards (a Lua error would:
# the whole backend would count as down). A counter that is not a number restarts
# from the floor, which PostgreSQL's accepted fence keeps above every old fence.
_ACQUIRE = """
local current = redis.pcall('GET', KEYS[1])
if type(current) == 'table' and current.err then return false end  -- not a string key
if current then
  local sep = string.find(current, '|', 1, true)
  if sep and string.sub(current, 1, sep - 1) == ARGV[1] then
    local mine = tonumber(string.sub(current, sep + 1))
    if mine then
      redis.call('PEXPIRE', KEYS[1], ARGV[2])
      return mine
    end
  end
  return false
end
local counter = tonumber(redis.call('GET', KEYS[2]))
if counter == nil or counter < tonumber(ARGV[3]) then
  redis.call('SET', KEYS[2], ARGV[3])
end
local fence = redis.call('INCR', KEYS[2])
if redis.call('SET', KEYS[1], ARGV[1] .. '|' .. fence, 'NX', 'PX', ARGV[2]) then
  return fence
end
return false
"""

# KEYS: lease. ARGV: exact value, ttl ms.
_RENEW = """
if redis.pcall('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

# KEYS: lease. ARGV: exact value.
_RELEASE = """
if redis.pcall('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""

# KEYS: members. ARGV: owner, ttl ms.
_HEARTBEAT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
return redis.call('ZRANGE', KEYS[1], 0, -1)
"""


class RedisElector:
    fenced = True
    backend = "redis"

    def __init__(self, url: str, owner: str, prefix: str = "webhook-poller:") -> None:
        self.owner = owner
        self.prefix = prefix
        self.client: aioredis.Redis = aioredis.Redis.from_url(
            url, socket_timeout=2.0, socket_connect_timeout=2.0, decode_responses=True
        )
        self._acquire = self.client.register_script(_ACQUIRE)
        self._renew = self.client.register_script(_RENEW)
        self._release = self.client.register_script(_RELEASE)
        self._heartbeat = self.client.register_script(_HEARTBEAT)

    async def _call(self, script: Any, keys: list[str], args: list[Any]) -> Any:
        try:
            return await script(keys=keys, args=args)
        except (RedisError, OSError) as exc:
            raise ElectionUnavailable(str(exc)) from exc

    def _lease_key(self, key: str) -> str:
        return f"{self.prefix}lease:{key}"

    async def acquire(self, key: str, ttl: float, floor: int = 0) -> Lease | None:
        began = time.monotonic()
        keys = [self._lease_key(key), f"{self.prefix}fence:{key}"]
        fence = await self._call(self._acquire, keys, [self.owner, int(ttl * 1000), floor])
        return Lease(key, self.owner, int(fence), began, ttl) if fence else None

    async def renew(self, lease: Lease) -> Lease | None:
        began = time.monotonic()
        value = f"{self.owner}|{lease.fence}"
        ok = await self._call(
            self._renew, [self._lease_key(lease.key)], [value, int(lease.ttl * 1000)]
        )
        return Lease(lease.key, self.owner, lease.fence, began, lease.ttl) if ok else None

    async def release(self, lease: Lease) -> None:
        await self._call(
            self._release, [self._lease_key(lease.key)], [f"{self.owner}|{lease.fence}"]
        )

    async def holders(self) -> list[Holding]:
        pattern = self._lease_key("*")
        try:
            keys = sorted([k async for k in self.client.scan_iter(match=pattern, count=500)])
            if not keys:
                return []
            async with self.client.pipeline(transaction=False) as pipe:
                for k in keys:
                    pipe.get(k)
                    pipe.pttl(k)
                answers = await pipe.execute(raise_on_error=False)  # one bad key: shown
        except (RedisError, OSError) as exc:
            raise ElectionUnavailable(str(exc)) from exc
        holdings = []
        for k, value, pttl in zip(keys, answers[0::2], answers[1::2], strict=True):
            if isinstance(value, Exception):  # not a string key (WRONGTYPE)
                value = f"<{type(value).__name__}>"
            if value is None or not isinstance(pttl, int) or pttl < 0:
                continue
            owner, _, fence = value.rpartition("|")
            if not (owner and fence.isascii() and fence.isdigit()):  # written by hand
                owner, fence = f"unreadable value {value[:40]!r}", "0"
            holdings.append(
                Holding(k.removeprefix(self._lease_key("")), owner, int(fence), pttl / 1000)
            )
        return holdings

    async def heartbeat(self, ttl: float) -> list[str]:
        members = await self._call(
            self._heartbeat, [f"{self.prefix}members"], [self.owner, int(ttl * 1000)]
        )
        return sorted(members)

    async def leave(self) -> None:
        try:
            await self.client.zrem(f"{self.prefix}members", self.owner)
        except (RedisError, OSError) as exc:
            raise ElectionUnavailable(str(exc)) from exc

    async def close(self) -> None:
        await self.client.aclose()
