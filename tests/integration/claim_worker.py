"""A separate OS process that claims and completes until the queue is empty.

Run as ``python -m tests.integration.claim_worker DB_URL OUT_FILE GO_FILE``;
writes every id it claimed (one per line) to OUT_FILE.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

from poller.rows.claims import Claims
from poller.rows.completions import CompletionResult
from poller.rules.outcomes import delivered
from poller.store.db import async_engine


async def _main(url: str, out: Path, go: Path) -> None:
    engine = async_engine(url, pool_size=1)
    claims = Claims(engine, poller_id=f"worker-{os.getpid()}", claim_lease=60)
    await claims.claim_batch(limit=0)  # connect before the start signal
    deadline = time.monotonic() + 30
    while not go.exists():  # a start line so the four processes overlap
        if time.monotonic() > deadline:
            raise SystemExit("no start signal")
        await asyncio.sleep(0.005)
    claimed: list[int] = []
    result = CompletionResult()
    while batch := await claims.claim_batch(limit=100):
        claimed += [m.id for m in batch]
        result = await claims.complete([delivered(m) for m in batch])
        assert not result.stale
    # An outcome whose row another worker's claim held locked for a moment (PostgreSQL
    # keeps the lock on a row its FOR UPDATE re-checked and passed over) is carried to the
    # next call, as the Completer's next write would: written once the lock goes.
    deadline = time.monotonic() + 30
    while result.busy:
        if time.monotonic() > deadline:
            raise SystemExit(f"outcomes still busy: {result.busy[:10]}")
        await asyncio.sleep(0.01)
        result = await claims.complete([])
        assert not result.stale
    out.write_text("".join(f"{i}\n" for i in claimed))
    await engine.dispose()


if __name__ == "__main__":
    asyncio.run(_main(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])))
