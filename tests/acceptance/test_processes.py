"""`poller run --processes N`: children share the shards, a killed or hung child comes
back, SIGTERM drains them all, one ops endpoint answers for all of them."""

from __future__ import annotations

import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, text

from tests.acceptance.procs import poller_env, receiver, started, stats, wait_until
from tests.conftest import make_endpoint
from tests.integration.helpers import seed
from tests.integration.service_helpers import counts


def _get(port: int, path: str) -> httpx.Response | None:
    try:
        return httpx.get(f"http://127.0.0.1:{port}{path}", timeout=3)
    except httpx.HTTPError:
        return None


def _children(port: int) -> list[dict[str, Any]]:
    answer = _get(port, "/healthz")
    return list(answer.json()["children"]) if answer is not None else []


def _delivered_by(engine: Engine) -> set[str]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT DISTINCT poller_id FROM poller_delivery_attempts"))
        return {r for (r,) in rows if r}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie is gone for our purpose
        return stat.read().split(") ")[1][0] != "Z"


@pytest.mark.slow
def test_processes_share_restart_and_drain(engine: Engine, db_url: str, tmp_path: Path) -> None:
    from poller.endpoints.registry import bucket_for
    from poller.local.embedded import free_port

    # An endpoint in each of the 4 shards: whichever way the children split them, both
    # have work (with one endpoint, both delivered only if its shard changed hands)
    names = {bucket_for(f"a{n}") % 4: f"a{n}" for n in range(64)}
    assert len(names) == 4
    with receiver(tmp_path, "--latency", "0.1") as (_, url):
        for name in names.values():
            make_endpoint(engine, name, url=url)
            seed(engine, 1000, name)
        port = free_port()
        env = poller_env(
            POLLER_DATABASE_URL=db_url,
            POLLER_METRICS_ADDR=f"127.0.0.1:{port}",
            POLLER_CONCURRENCY="10",
            POLLER_MAX_IN_FLIGHT="10",
            POLLER_SHARDS="4",
            POLLER_CHILD_HUNG_AFTER="2",
        )
        args = ["run", "--processes", "2", "--id", "fleet"]
        with started(args, env, tmp_path / "fleet.log") as fleet:
            base = f"fleet-{fleet.popen.pid}"  # the supervisor's PID: names never repeat
            wait_until(lambda: sum(c["running"] for c in _children(port)) == 2, timeout=20)
            wait_until(lambda: _delivered_by(engine) >= {f"{base}-0", f"{base}-1"}, timeout=20)
            victim = _children(port)[0]["pid"]
            os.kill(victim, signal.SIGKILL)
            wait_until(lambda: _children(port)[0]["name"] == f"{base}-0.1", timeout=20)
            wait_until(lambda: f"{base}-0.1" in _delivered_by(engine), timeout=30)
            hung = _children(port)[1]["pid"]
            os.kill(hung, signal.SIGSTOP)  # a blocked child answers no /healthz: killed
            wait_until(lambda: _children(port)[1]["name"] == f"{base}-1.1", timeout=20)
            wait_until(lambda: f"{base}-1.1" in _delivered_by(engine), timeout=30)
            assert not _alive(hung)
            ready = _get(port, "/readyz")
            assert ready is not None and ready.status_code == 200, ready and ready.text
            scraped = _get(port, "/metrics")
            assert scraped is not None and scraped.status_code == 200
            assert 'process="0"' in scraped.text and 'process="1"' in scraped.text
            assert "webhook_poller_child_restarts_total 2.0" in scraped.text
            assert "webhook_poller_children_up 2.0" in scraped.text
            pids = [c["pid"] for c in _children(port)]
            assert counts(engine).get("pending", 0) > 0  # still work to cut short
            began = time.monotonic()
            fleet.signal(signal.SIGTERM)
            assert fleet.wait(timeout=30) == 0, fleet.output()[-3000:]
            assert time.monotonic() - began < 15
            assert not any(_alive(pid) for pid in pids)
        received = stats(url)
    with engine.connect() as conn:
        left = conn.execute(
            text("SELECT claimed_by FROM poller_outbox WHERE status = 'in_flight'")
        ).all()
    # The drain released everything the live children held; only what the killed
    # children held may still wait for their claim lease to end.
    assert {r.claimed_by for r in left} <= {f"{base}-0", f"{base}-1"}
    assert received["unique"] >= counts(engine)["delivered"]  # each delivered row arrived
    assert "Traceback" not in fleet.output()


def test_processes_flag_is_validated(tmp_path: Path) -> None:
    for value, says in (("0", "between 1 and"), ("many", "whole number or 'auto'")):
        with started(["run", "--processes", value], poller_env(), tmp_path / "p.log") as proc:
            assert proc.wait(timeout=20) == 2
        assert says in proc.output() and "Traceback" not in proc.output()


@pytest.mark.slow
def test_a_child_refused_its_settings_stops_the_fleet_with_exit_2(
    empty_db_url: str, tmp_path: Path
) -> None:
    env = poller_env(POLLER_DATABASE_URL=empty_db_url)
    args = ["run", "--processes", "2", "--id", "fleet"]
    with started(args, env, tmp_path / "fleet.log") as fleet:
        assert fleet.wait(timeout=30) == 2
    assert "database schema is at nothing" in fleet.output()
    assert "restarting" not in fleet.output()


@pytest.mark.slow
def test_children_of_a_killed_supervisor_stop_by_themselves(
    engine: Engine, db_url: str, tmp_path: Path
) -> None:
    """SIGKILL gives the supervisor no chance to forward anything: its children, in
    their own sessions, must notice it is gone and stop rather than run on as orphans."""
    from poller.local.embedded import free_port

    port = free_port()
    env = poller_env(POLLER_DATABASE_URL=db_url, POLLER_METRICS_ADDR=f"127.0.0.1:{port}")
    args = ["run", "--processes", "2", "--id", "orphans"]
    with started(args, env, tmp_path / "fleet.log") as fleet:
        wait_until(lambda: sum(c["running"] for c in _children(port)) == 2, timeout=20)
        pids = [c["pid"] for c in _children(port)]
        fleet.signal(signal.SIGKILL)
        fleet.wait(timeout=10)
        wait_until(lambda: not any(_alive(pid) for pid in pids), timeout=20)
    # What the killed supervisor could not remove, the last child out did.
    assert not list(Path(tempfile.gettempdir()).glob(f"poller-fleet-{fleet.popen.pid}-*"))
    assert fleet.output().count("is gone: stopping gracefully") == 2


@pytest.mark.parametrize("processes", ["1", "2"])
def test_a_metrics_port_in_use_is_one_line_and_exit_2(
    db_url: str, tmp_path: Path, processes: str
) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = poller_env(POLLER_DATABASE_URL=db_url, POLLER_METRICS_ADDR=f"127.0.0.1:{port}")
        args = ["run", "--processes", processes]
        with started(args, env, tmp_path / f"p{processes}.log") as poller:
            assert poller.wait(timeout=30) == 2
    assert f"POLLER_METRICS_ADDR=127.0.0.1:{port}: cannot listen there" in poller.output()
    assert "Traceback" not in poller.output()
