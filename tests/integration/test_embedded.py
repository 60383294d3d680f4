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
