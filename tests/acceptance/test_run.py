"""`poller run` as a real process: SIGTERM drains and releases, SIGKILL loses nothing."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from tests.acceptance.procs import poller_env, receiver, started, stats, wait_until
from tests.conftest import make_endpoint
from tests.integration.helpers import seed
from tests.integration.service_helpers import counts


@pytest.mark.slow
def test_sigterm_drains_releases_and_exits_0(engine: Engine, db_url: str, tmp_path: Path) -> None:
    with receiver(tmp_path, "--latency", "2") as (_, url):
        make_endpoint(engine, "a", url=url)
        seed(engine, 200, "a")
        env = poller_env(
            POLLER_DATABASE_URL=db_url,
            POLLER_CONCURRENCY="20",
            POLLER_MAX_IN_FLIGHT="20",
            POLLER_REQUEST_TIMEOUT="5",
            POLLER_CLAIM_LEASE="11",
            POLLER_SHUTDOWN_GRACE="0.5",
        )
        with started(["run", "--id", "p1"], env, tmp_path / "p1.log") as poller:
            wait_until(lambda: stats(url)["received"] >= 20, timeout=20)
            began = time.monotonic()
            poller.signal(signal.SIGTERM)
            assert poller.wait(timeout=20) == 0, poller.output()
            assert time.monotonic() - began < 10
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT status, attempts, needs_lookup FROM poller_outbox")).all()
    assert {r.status for r in rows} == {"pending"}  # nothing left in flight, nothing lost
    assert {r.attempts for r in rows} == {0}  # released without counting the attempt
    assert sum(r.needs_lookup for r in rows) == 20  # the cut-off sends are looked up next time


@pytest.mark.slow
def test_sigkill_then_another_poller_delivers_everything(
    engine: Engine, db_url: str, tmp_path: Path
) -> None:
    total = 1000
    with receiver(tmp_path, "--latency", "0.01") as (_, url):
        make_endpoint(engine, "a", url=url)
        keys = {f"a:{i}" for i in range(total)}
        seed(engine, total, "a")
        env = poller_env(POLLER_DATABASE_URL=db_url, POLLER_CONCURRENCY="50")
        with started(["run", "--id", "victim"], env, tmp_path / "victim.log") as victim:
            wait_until(lambda: stats(url)["received"] >= 100, timeout=20)

            def frozen_holding_claims() -> bool:
                """Frozen, it changes nothing: killed now, it dies holding what it holds
                (between a completion and its next claim it may hold nothing)."""
                victim.signal(signal.SIGSTOP)
                if counts(engine).get("in_flight", 0) > 0:
                    return True
                victim.signal(signal.SIGCONT)
                return False

            wait_until(frozen_holding_claims, timeout=20, interval=0.01)
            victim.signal(signal.SIGKILL)
            victim.wait(timeout=10)
        assert counts(engine).get("in_flight", 0) > 0  # it died holding claims
        with started(["run", "--id", "rescuer"], env, tmp_path / "rescuer.log"):
            wait_until(lambda: counts(engine) == {"delivered": total}, timeout=60)
        final = stats(url)
    assert final["unique"] == total  # 0 lost
    assert final["received"] == final["unique"] + final["duplicates"]
    with engine.connect() as conn:
        stored = {k for (k,) in conn.execute(text("SELECT idempotency_key FROM poller_outbox"))}
    assert stored == keys


@pytest.mark.slow
def test_a_second_signal_exits_at_once(engine: Engine, db_url: str, tmp_path: Path) -> None:
    with receiver(tmp_path, "--latency", "30") as (_, url):
        make_endpoint(engine, "a", url=url)
        seed(engine, 5, "a")
        env = poller_env(
            POLLER_DATABASE_URL=db_url,
            POLLER_REQUEST_TIMEOUT="40",
            POLLER_CLAIM_LEASE="90",
            POLLER_SHUTDOWN_GRACE="60",
        )
        with started(["run", "--id", "p1"], env, tmp_path / "p1.log") as poller:
            wait_until(lambda: stats(url)["received"] == 5, timeout=20)
            poller.signal(signal.SIGTERM)  # graceful: would wait up to 60 s for the 5
            poller.wait_for("stopping gracefully")
            began = time.monotonic()
            poller.signal(signal.SIGTERM)
            assert poller.wait(timeout=10) == 130
            assert time.monotonic() - began < 5
    assert counts(engine) == {"in_flight": 5}  # left to expire and be reclaimed


@pytest.mark.slow
def test_a_crashed_loop_makes_the_process_unhealthy_and_exit_70(
    engine: Engine, db_url: str, tmp_path: Path
) -> None:
    """Crash-only (G11): a loop meeting a state nobody planned for does not limp on."""
    from poller.local.embedded import free_port

    with receiver(tmp_path) as (_, url):
        make_endpoint(engine, "a", url=url)
        port = free_port()
        env = poller_env(POLLER_DATABASE_URL=db_url, POLLER_METRICS_ADDR=f"127.0.0.1:{port}")
        with started(["run", "--id", "p1"], env, tmp_path / "p1.log") as poller:
            wait_until(lambda: _health(port) == 200, timeout=20)
            with engine.begin() as conn:  # every claim now meets an undefined table
                conn.execute(text("ALTER TABLE poller_shard_fences RENAME TO moved_away"))
            assert poller.wait(timeout=30) == 70, poller.output()[-3000:]
    assert "crashed" in poller.output() and "UndefinedTable" in poller.output()


def _health(port: int) -> int:
    import httpx

    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code
    except httpx.HTTPError:
        return 0


def test_run_on_an_unmigrated_database_is_one_line_and_exit_2(
    empty_db_url: str, tmp_path: Path
) -> None:
    env = poller_env(POLLER_DATABASE_URL=empty_db_url)
    with started(["run", "--id", "p1"], env, tmp_path / "p1.log") as poller:
        assert poller.wait(timeout=30) == 2
    assert "error: database schema is at nothing" in poller.output()
    assert "Traceback" not in poller.output()


@pytest.mark.slow
def test_a_poller_started_while_postgres_is_down_waits_for_it(tmp_path: Path) -> None:
    """Found by the fault hunt: a poller restarted during a PostgreSQL restart exited 2."""
    from poller.local.embedded import EmbeddedPostgres
    from poller.store import migrate
    from poller.store.db import sync_engine

    server = EmbeddedPostgres(tmp_path / "pg", durable=False)
    (tmp_path / "pg").mkdir()
    url = server.start()
    migrate.upgrade(url)
    engine = sync_engine(url)
    try:
        with receiver(tmp_path) as (_, receiver_url):
            make_endpoint(engine, "a", url=receiver_url)
            seed(engine, 10, "a")
            engine.dispose()
            server.stop()
            env = poller_env(POLLER_DATABASE_URL=url)
            with started(["run", "--id", "p1"], env, tmp_path / "p1.log") as poller:
                wait_until(lambda: "database unavailable" in poller.output(), timeout=30)
                server.start()
                wait_until(lambda: stats(receiver_url)["unique"] == 10, timeout=30)
                poller.signal(signal.SIGTERM)
                assert poller.wait(timeout=20) == 0, poller.output()[-2000:]
    finally:
        engine.dispose()
        server.stop()


@pytest.mark.parametrize(
    ("flag", "variable"), [("--shards", "SHARDS"), ("--concurrency", "CONCURRENCY")]
)
def test_run_flags_are_validated_like_the_settings_they_override(
    db_url: str, tmp_path: Path, flag: str, variable: str
) -> None:
    env = poller_env(POLLER_DATABASE_URL=db_url)
    with started(["run", flag, "0"], env, tmp_path / "p.log") as poller:
        assert poller.wait(timeout=30) == 2
    assert f"POLLER_{variable}=0" in poller.output() and "Traceback" not in poller.output()


def test_the_reference_receiver_warns_when_it_checks_no_signature(tmp_path: Path) -> None:
    with receiver(tmp_path) as (proc, _):
        assert "warning: no --secret or --public-key given" in proc.output()
    (tmp_path / "signed").mkdir()
    with receiver(tmp_path / "signed", "--secret", "whsec_" + "A" * 32) as (proc, _):
        assert "warning" not in proc.output()
