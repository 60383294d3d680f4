"""`poller demo` from a clean environment: delivers, summarises, leaves nothing running."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest


def _row(output: str, label: str) -> str:
    found = re.search(rf"{re.escape(label)}\s*│\s*([^│]+?)\s*│", output)
    assert found, f"{label!r} not in:\n{output}"
    return found.group(1)


@pytest.mark.slow
def test_demo_delivers_and_leaves_nothing_running(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLLER_")}
    done = subprocess.run(
        [sys.executable, "-m", "poller", "demo", "--messages", "500"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    # Every 50th goes to "legacy", down until the rest are delivered: its circuit opens,
    # its messages wait without spending attempts, and drain once a probe gets through.
    # 500 enqueued, and 50 invoice events published: 25 without a tenant reach ledger and
    # analytics, 25 for tenant acme reach only acme-hooks.
    assert int(_row(out, "delivered")) == 500 + 75
    assert re.search(r"75\s+deliveries\s+to\s+3\s+subscribed\s+endpoints", out)
    assert _row(out, "fan-out applied: ledger / analytics / acme-hooks") == "25 / 25 / 25"
    # ledger's receiver holds only the ed25519 public key; analytics' requires a bearer token
    assert _row(out, "ledger (ed25519, public key only): bad signatures") == "0"
    assert _row(out, "analytics (bearer header required): refused") == "0"
    assert "verifies with the public key" in out and "whpk_" in out
    assert int(_row(out, "failed")) == 0
    opened, probes = (int(n) for n in _row(out, "circuits opened / probes sent").split(" / "))
    assert opened == 1 and probes >= 1
    # 5 or more: two completions may land in one judgement; rich may wrap the line
    opened_line = (
        r"event\s+endpoint\.circuit_opened\s+legacy:\s+\d+\s+failed\s+sends\s+in\s+a\s+row"
    )
    assert re.search(opened_line, out), out
    assert "event endpoint.circuit_closed legacy" in out
    assert int(_row(out, "still open")) == 0
    assert int(_row(out, "rolled-back message stored")) == 0
    assert int(_row(out, "applied by orders' receiver (unique keys)")) == 490
    assert int(_row(out, "applied by legacy's receiver, once it came back")) == 10
    # one in five goes out in order per customer: 100, less the 10 sent to "legacy"
    assert _row(out, "ordered messages applied / order violations") == "90 / 0"
    assert "failed for good" not in out + done.stderr  # the summary says it, once
    assert max(len(line) for line in out.splitlines()) <= 80  # piped: fits a terminal
    assert "retries after 0.2, 0.5, 1 s" in out
    ports = {int(p) for p in re.findall(r"127\.0\.0\.1:(\d+)", out)}
    assert len(ports) == 4  # PostgreSQL, Redis, two receivers
    for port in ports:
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
