"""Leader election: who polls which shard. Row claims keep the contract either way.

An :class:`Elector` hands out leases on named keys (``shard:3``,
``maintenance``) with a **fence** that grows on every change of holder, and
keeps a list of live members for balancing. Backends:

* ``redis`` (poller/election/redis.py) — ``SET NX PX``, Lua compare-and-extend
  renew, Lua compare-and-delete release, fence from ``INCR`` on a separate
  non-expiring counter;
* ``postgres`` (poller/election/postgres.py) — a lease row upserted on the
  database clock, fence + 1 on every takeover;
* ``none`` (poller/election/none.py) — every poller owns every shard.

PostgreSQL has the last word: the claim transaction checks and advances each
shard's last accepted fence (``poller_shard_fences``), so a leader whose lease
was taken over claims nothing, whatever the backend believes — and a backend
that forgets its counter (Redis restarted without persistence) is handed the
shard's last accepted fence as the *floor* its next fence must exceed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Lease:
    """A lease this poller holds. ``acquired_at`` is the local monotonic time taken
    *before* the request that won or renewed it, so ``acquired_at + ttl`` is never
    later than the backend's own expiry."""

    key: str
    owner: str
    fence: int
    acquired_at: float
    ttl: float


@dataclass(frozen=True, slots=True)
class Holding:
    key: str
    owner: str
    fence: int
    expires_in: float


class Elector(Protocol):
    owner: str
    fenced: bool  # False only for ``none``: every poller owns every shard, no fences
    backend: str  # "redis", "postgres" or "none": recorded cluster-wide, all must agree

    async def acquire(self, key: str, ttl: float, floor: int = 0) -> Lease | None:
        """Take ``key`` if it is free (or already ours); the fence exceeds ``floor``."""

    async def renew(self, lease: Lease) -> Lease | None:
        """Extend our lease; None if it was lost (expired or taken)."""

    async def release(self, lease: Lease) -> None:
        """Give the lease up now, if it is still ours."""

    async def holders(self) -> list[Holding]:
        """Every live lease."""

    async def heartbeat(self, ttl: float) -> list[str]:
        """Say we are alive for ``ttl`` seconds; return every live member (us included)."""

    async def leave(self) -> None:
        """Stop being a member now (graceful stop)."""

    async def close(self) -> None: ...


def shard_key(shard: int) -> str:
    return f"shard:{shard}"


MAINTENANCE = "maintenance"


def make_elector(
    backend: str, *, owner: str, engine: object = None, redis_url: str | None = None
) -> Elector:
    """The elector for ``backend`` (``redis``, ``postgres`` or ``none``)."""
    if backend == "none":
        from poller.election.none import NoElector

        return NoElector(owner)
    if backend == "redis":
        if not redis_url:
            from poller.errors import ConfigurationError

            raise ConfigurationError("POLLER_ELECTION=redis needs POLLER_REDIS_URL")
        from poller.election.redis import RedisElector

        return RedisElector(redis_url, owner)
    from sqlalchemy.ext.asyncio import AsyncEngine

    from poller.election.postgres import PostgresElector

    assert isinstance(engine, AsyncEngine)
    return PostgresElector(engine, owner)
