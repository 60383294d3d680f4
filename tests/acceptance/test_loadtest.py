"""The load test, run small: its invariants hold — and it notices a lost delivery."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import repo_root


def _run(out: Path, *extra: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("POLLER_", "LOADTEST_"))}
    env.pop("FAULTS", None)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "loadtest.run",
            "--users",
            "3",
            "--spawn-rate",
            "3",
            "--duration",
            "3",
            "--drain",
            "30",
            "--out",
            str(out),
            *extra,
        ],
        cwd=repo_root(),
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    report = json.loads((out / "report.json").read_text())
    return done.returncode, report


@pytest.mark.slow
def test_small_load_test_holds_its_invariants(tmp_path: Path) -> None:
    code, report = _run(tmp_path)
    figures = report["figures"]
    assert code == 0 and report["invariants_broken"] == []
    assert figures["orders_committed"] > 0
    assert figures["lost"] == 0 and figures["duplicate_effects"] == 0
    assert figures["delivered"] == figures["orders_committed"]
    for name in ("report.md", "report.png", "locust.html"):
        assert (tmp_path / name).stat().st_size > 0


@pytest.mark.slow
def test_a_receiver_that_loses_a_message_fails_the_load_test(tmp_path: Path) -> None:
    code, report = _run(tmp_path, "--ack-and-discard", "1")
    assert code == 1
    assert report["figures"]["lost"] == 1
    assert "never delivered" in report["invariants_broken"][0]
