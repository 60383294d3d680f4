"""The ``none`` backend: no election. Every poller claims from every shard and
runs maintenance; SKIP LOCKED and the claim-token fence keep that correct."""

from __future__ import annotations

import time

from poller.election import Holding, Lease


class NoElector:
    fenced = False
    backend = "none"

    def __init__(self, owner: str) -> None:
        self.owner = owner

    async def acquire(self, key: str, ttl: float, floor: int = 0) -> Lease | None:
        return Lease(key, self.owner, floor, time.monotonic(), float("inf"))

    async def renew(self, lease: Lease) -> Lease | None:
        return lease

    async def release(self, lease: Lease) -> None:
        return None

    async def holders(self) -> list[Holding]:
        return []

    async def heartbeat(self, ttl: float) -> list[str]:
        return [self.owner]

    async def leave(self) -> None:
        return None

    async def close(self) -> None:
        return None
