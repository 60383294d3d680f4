"""Concurrency: several OS processes claiming from one queue never claim a row twice."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select

from poller.endpoints.registry import CreatedEndpoint
from poller.store.schema import outbox
from tests.conftest import repo_root
from tests.integration.helpers import seed

ROWS = 20_000
WORKERS = 4


@pytest.mark.slow
def test_four_processes_claim_every_row_exactly_once(
    engine: Engine, endpoint: CreatedEndpoint, db_url: str, tmp_path: Path
) -> None:
    ids = seed(engine, ROWS)
    go = tmp_path / "go"
    outs = [tmp_path / f"claimed-{n}" for n in range(WORKERS)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.integration.claim_worker", db_url, str(out), str(go)],
            cwd=repo_root(),
        )
        for out in outs
    ]
    try:
        go.touch()
        codes = [p.wait(timeout=90) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert codes == [0] * WORKERS
    per_worker = [[int(line) for line in out.read_text().split()] for out in outs]
    counts = Counter(i for claimed in per_worker for i in claimed)
    assert sorted(counts) == sorted(ids)  # every row claimed ...
    assert set(counts.values()) == {1}  # ... exactly once
    assert all(per_worker), "every worker should have won some batches"
    with engine.connect() as conn:
        statuses = dict(
            conn.execute(select(outbox.c.status, func.count()).group_by("status")).all()
        )
    assert statuses == {"delivered": ROWS}
