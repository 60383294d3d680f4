"""The embedded servers: idempotent start, restart on the same port, clean stop."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
import redis

from poller.local.embedded import EmbeddedPostgres, EmbeddedRedis
from poller.store.db import libpq_url


@pytest.mark.slow
def test_postgres_start_is_idempotent_and_restart_keeps_the_port(tmp_path: Path) -> None:
    server = EmbeddedPostgres(tmp_path, durable=False)
    try:
        url = server.start()
        assert EmbeddedPostgres(tmp_path).start() == url  # a second handle finds it running
        with psycopg.connect(libpq_url(url), autocommit=True) as conn:
            conn.execute("CREATE TABLE kept (x int)")
            pid = server.pid
        assert server.restart() == url
        assert server.pid != pid
        with psycopg.connect(libpq_url(url)) as conn:
            assert conn.execute("SELECT count(*) FROM kept").fetchone() == (0,)
    finally:
        server.stop()
    assert server.port is None and server.pid is None


def test_redis_start_stop_restart_loses_keys(tmp_path: Path) -> None:
    server = EmbeddedRedis(tmp_path)
    try:
        url = server.start()
        assert EmbeddedRedis(tmp_path).start() == url
        client = redis.Redis.from_url(url)
        client.set("fence", 7)
        server.stop()
        assert server.pid is None
        assert server.start() == url  # same port again
        assert redis.Redis.from_url(url).get("fence") is None  # no persistence
    finally:
        server.stop()


def test_files_tampered_with_are_not_trusted(tmp_path: Path) -> None:
    """The port and pid files are ours, but a person (or a full disk) can spoil them: a
    port that is no port, bytes that are not text. The server starts on a free port."""
    from poller.local.embedded import _port_in

    assert [_port_in(t) for t in ("6379\n", "0", "65536", "99999", "²", "-1", "x", "")] == [
        6379, None, None, None, None, None, None, None,
    ]  # fmt: skip
    server = EmbeddedRedis(tmp_path)
    server.dir.mkdir(parents=True)
    (server.dir / "port").write_bytes(b"99999\xff")
    (server.dir / "redis.pid").write_bytes(b"\xff\xfe")
    try:
        assert server.pid is None and server.port is None
        url = server.start()
        assert redis.Redis.from_url(url).ping()
    finally:
        server.stop()


def _gone(check: Callable[[], bool], timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return False


@pytest.mark.slow
def test_a_benchmark_cut_short_leaves_no_postgres_behind(tmp_path: Path) -> None:
    """A second Ctrl-C on a benchmark (``os._exit``) skipped the cleanup that stops its
    embedded PostgreSQL: the server ran on, with its folder. A watcher stops it now."""
    code = (
        "import os, sys, tempfile\n"
        "tempfile.tempdir = sys.argv[1]\n"
        "from loadtest.bench_db import server_url\n"
        "with server_url() as url:\n"
        "    print(url, flush=True)\n"
        "    os._exit(130)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "POLLER_DATABASE_URL"}
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 130, done.stderr
    url = done.stdout.strip()

    def refused() -> bool:
        try:
            psycopg.connect(libpq_url(url), connect_timeout=2).close()
        except psycopg.OperationalError:
            return True
        return False

    assert _gone(refused), "the benchmark's PostgreSQL still answers"
    assert _gone(lambda: not list(tmp_path.glob("poller-bench-*")))


def _killed(setup: str, tmp_path: Path) -> str:
    """Run ``setup`` in a process of its own (``sys.argv[1]``: ``tmp_path``), then SIGKILL
    it; what it printed."""
    code = "import os, sys\nfrom pathlib import Path\n" + setup + "os.kill(os.getpid(), 9)\n"
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == -9, done.stderr
    return done.stdout


def test_a_server_stops_when_the_process_that_watches_over_it_dies(tmp_path: Path) -> None:
    _killed(
        "from poller.local.embedded import EmbeddedRedis\n"
        "from poller.service.server_watch import stop_at_exit\n"
        "server = EmbeddedRedis(Path(sys.argv[1]))\n"
        "stop_at_exit(server, remove=Path(sys.argv[1]) / 'redis')\n"
        "print(server.start(), flush=True)\n",
        tmp_path,
    )
    server = EmbeddedRedis(tmp_path)
    assert _gone(lambda: server.pid is None and not server.dir.exists())


def test_a_harness_killed_takes_its_child_processes_with_it(tmp_path: Path) -> None:
    """A load test or a hunt killed mid-run (SIGKILL, a second Ctrl-C) left its pollers,
    receiver and locust running: each child of loadtest.procs.Proc is ended by a reaper
    once the process that started it is gone."""
    out = _killed(
        "from loadtest.procs import Proc\n"
        "child = Proc(['-n', '1', '-r', '1', 'import time; time.sleep(600)'],\n"
        "             dict(os.environ), Path(sys.argv[1]) / 'child.log', module='timeit')\n"
        "assert child.popen.poll() is None\n"
        "print(child.popen.pid, flush=True)\n",
        tmp_path,
    )
    child = int(out)

    def ended() -> bool:  # gone, or a zombie nobody has reaped yet
        try:
            return Path(f"/proc/{child}/stat").read_text().rpartition(")")[2].split()[0] == "Z"
        except FileNotFoundError:
            return True

    assert _gone(ended, timeout=30), "the harness's child still runs"
