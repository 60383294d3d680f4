"""A database for a benchmark: POLLER_DATABASE_URL, else a throwaway embedded server."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg

from poller.local.embedded import EmbeddedPostgres
from poller.service.server_watch import stop_at_exit
from poller.store import migrate
from poller.store.db import libpq_url


@contextlib.contextmanager
def server_url() -> Iterator[str]:
    """An admin URL: the configured server, or an embedded one (fsync off) for this run."""
    external = os.environ.get("POLLER_DATABASE_URL")
    if external:
        yield external
        return
    with tempfile.TemporaryDirectory(prefix="poller-bench-") as tmp:
        server = EmbeddedPostgres(Path(tmp), durable=False)
        stop_at_exit(server, remove=Path(tmp))  # a second Ctrl-C skips the finally
        try:
            yield server.start()
        finally:
            server.stop()


def fresh_database(admin_url: str, name: str) -> str:
    """(Re)create database ``name`` on the server, migrated; return its URL."""
    with psycopg.connect(libpq_url(admin_url), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    base, _, rest = admin_url.rpartition("/")
    query = rest.partition("?")[2]
    url = f"{base}/{name}" + (f"?{query}" if query else "")
    migrate.upgrade(url)
    return url
