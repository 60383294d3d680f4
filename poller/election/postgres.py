"""The ``postgres`` backend: lease rows upserted on the database clock."""

from __future__ import annotations

import time

from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from poller.election import Holding, Lease
from poller.errors import ElectionUnavailable
from poller.store import queries


class PostgresElector:
    fenced = True
    backend = "postgres"

    def __init__(self, engine: AsyncEngine, owner: str) -> None:
        self.engine = engine
        self.owner = owner

    async def _rows(self, statement: object, params: dict[str, object]) -> list[object]:
        try:
            async with self.engine.begin() as conn:
                result = await conn.execute(statement, params)  # type: ignore[call-overload]
                return list(result.all()) if result.returns_rows else []
        except (DBAPIError, OSError) as exc:
            raise ElectionUnavailable(str(exc)) from exc

    async def acquire(self, key: str, ttl: float, floor: int = 0) -> Lease | None:
        began = time.monotonic()
        rows = await self._rows(
            queries.LEASE_ACQUIRE, {"key": key, "holder": self.owner, "ttl": ttl, "floor": floor}
        )
        return Lease(key, self.owner, int(rows[0].fence), began, ttl) if rows else None  # type: ignore[attr-defined]

    async def renew(self, lease: Lease) -> Lease | None:
        began = time.monotonic()
        rows = await self._rows(
            queries.LEASE_RENEW,
            {"key": lease.key, "holder": self.owner, "fence": lease.fence, "ttl": lease.ttl},
        )
        return Lease(lease.key, self.owner, lease.fence, began, lease.ttl) if rows else None

    async def release(self, lease: Lease) -> None:
        await self._rows(
            queries.LEASE_RELEASE, {"key": lease.key, "holder": self.owner, "fence": lease.fence}
        )

    async def holders(self) -> list[Holding]:
        rows = await self._rows(queries.LEASE_HOLDERS, {})
        return [Holding(r.key, r.holder, int(r.fence), float(r.expires_in)) for r in rows]  # type: ignore[attr-defined]

    async def heartbeat(self, ttl: float) -> list[str]:
        rows = await self._rows(queries.MEMBER_HEARTBEAT, {"poller_id": self.owner, "ttl": ttl})
        return sorted(r.poller_id for r in rows)  # type: ignore[attr-defined]

    async def leave(self) -> None:
        await self._rows(queries.MEMBER_LEAVE, {"poller_id": self.owner})

    async def close(self) -> None:
        return None
