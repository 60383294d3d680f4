"""The load test's processes: PostgreSQL + Redis, the receiver, the order app, pollers.

Shared by ``make loadtest`` (loadtest/run.py) and ``make loadtest-ramp``
(loadtest/ramp.py). Every process is started here and ended here, by PID.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from loadtest.procs import Proc, clean_env
from poller.endpoints.registry import create_endpoint, new_secret
from poller.local.embedded import EmbeddedPostgres, EmbeddedRedis, free_port
from poller.service.server_watch import stop_at_exit
from poller.store import migrate
from poller.store.db import sync_engine


@dataclass
class Servers:
    database_url: str
    redis_url: str
    postgres_pid: int | None  # the embedded postmaster (its backends are its children)


@contextlib.contextmanager
def servers(tmp: Path) -> Iterator[Servers]:
    """Configured PostgreSQL/Redis (POLLER_DATABASE_URL / POLLER_REDIS_URL), else embedded."""
    db, redis = os.environ.get("POLLER_DATABASE_URL"), os.environ.get("POLLER_REDIS_URL")
    pg = None if db else EmbeddedPostgres(tmp, durable=False)
    rs = None if redis else EmbeddedRedis(tmp)
    # A SIGTERM or a second Ctrl-C skips the finally below, and the caller's cleanup of
    # ``tmp``: the watchers stop the servers and remove their data (40 MB for PostgreSQL).
    if pg is not None:
        stop_at_exit(pg, remove=pg.pgdata)
    if rs is not None:
        stop_at_exit(rs, remove=rs.dir)
    try:
        db_url = db or pg.start()  # type: ignore[union-attr]
        redis_url = redis or rs.start()  # type: ignore[union-attr]
        pid = None
        if pg is not None:
            pid = int((pg.pgdata / "postmaster.pid").read_text().split()[0])
        yield Servers(db_url, redis_url, pid)
    finally:
        if rs is not None:
            rs.stop()
        if pg is not None:
            pg.stop()


@dataclass
class Stack:
    receiver: Proc
    receiver_url: str
    app: Proc
    app_url: str
    pollers: list[Proc]
    procs: list[Proc] = field(default_factory=list)


@contextlib.contextmanager
def stack(
    tmp: Path,
    servers: Servers,
    *,
    pollers: int,
    processes: int = 1,
    batch_size: int = 100,
    concurrency: int = 64,
    app_workers: int = 1,
    receiver_flags: tuple[str, ...] = (),
) -> Iterator[Stack]:
    """Migrated database, receiver + "orders" endpoint, the app (healthy), the pollers."""
    migrate.upgrade(servers.database_url)
    engine = sync_engine(servers.database_url)
    procs: list[Proc] = []
    try:
        secret = new_secret()
        receiver = Proc(
            ["receiver", "--port", "0", "--secret", secret, *receiver_flags],
            clean_env(),
            tmp / "receiver.log",
        )
        procs.append(receiver)
        port = receiver.wait_for(r"listening on http://127\.0\.0\.1:(\d+)").group(1)
        receiver_url = f"http://127.0.0.1:{port}"
        with engine.begin() as conn:
            create_endpoint(
                conn,
                "orders",
                f"{receiver_url}/orders",
                secret=secret,
                lookup_url=f"{receiver_url}/webhooks/{{idempotency_key}}",
                allow_private=True,
            )
        app_port = free_port()
        app = Proc(
            ["loadtest.app:app", "--port", str(app_port), "--log-level", "warning"]
            + (["--workers", str(app_workers)] if app_workers > 1 else []),
            clean_env(POLLER_DATABASE_URL=servers.database_url),
            tmp / "app.log",
            module="uvicorn",
        )
        procs.append(app)
        env = clean_env(
            POLLER_DATABASE_URL=servers.database_url,
            POLLER_REDIS_URL=servers.redis_url,
            POLLER_ALLOW_PRIVATE_TARGETS="true",
            POLLER_BATCH_SIZE=str(batch_size),
            POLLER_CONCURRENCY=str(concurrency),
            POLLER_LOG_FORMAT="json",
            POLLER_LEASE_TTL="3",
            POLLER_CLAIM_LEASE="8",
            POLLER_REQUEST_TIMEOUT="3",
            POLLER_SWEEP_INTERVAL="1",
            POLLER_RETRY_SCHEDULE="[0.5, 1, 2, 4]",
            POLLER_CIRCUIT_COOLDOWN="1",
            POLLER_CIRCUIT_COOLDOWN_MAX="4",
        )
        many = ["--processes", str(processes)] if processes > 1 else []
        started = [
            Proc(["run", "--id", f"poller-{n}", *many], env, tmp / f"poller-{n}.log")
            for n in range(pollers)
        ]
        procs.extend(started)
        app_url = f"http://127.0.0.1:{app_port}"
        wait_healthy(f"{app_url}/healthz")
        yield Stack(receiver, receiver_url, app, app_url, started, procs)
    finally:
        for proc in reversed(procs):
            proc.stop()
        engine.dispose()


def wait_healthy(url: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=1).status_code == 200:
                return
        time.sleep(0.1)
    raise SystemExit(f"{url} did not become healthy")
