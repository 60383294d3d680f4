"""The embedded servers: idempotent start, restart on the same port, clean stop."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
import redis

from poller.db import libpq_url
from poller.embedded import EmbeddedPostgres, EmbeddedRedis


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
    from poller.embedded import _port_in

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
