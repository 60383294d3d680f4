"""``make loadtest``: the app, the receiver and N pollers under locust, then a report.

    python -m loadtest.run [--users 20] [--spawn-rate 10] [--duration 60] [--pollers 2]
                           [--batch-size 100] [--concurrency 64] [--drain 120] [--faults]

Starts embedded PostgreSQL and Redis (or uses POLLER_DATABASE_URL /
POLLER_REDIS_URL), migrates, starts the reference receiver, the order app
(uvicorn) and the pollers, runs locust headless for --duration seconds, then
waits up to --drain seconds for every committed order's webhook to be
delivered (or visibly failed), and writes ``loadtest/out/`` report.md,
report.json, report.png and locust's HTML and CSV. Exit 1 if an invariant
broke (lost > 0, duplicate effects > 0, delivered + failed ≠ committed).

``--faults`` (``make loadtest FAULTS=1``): the receiver answers 10 % 5xx,
drops 2 % of answers after processing and adds 50 ms; every 10 s one poller is
SIGKILLed and restarted. Every process started here is ended (by PID) before
exit.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
from sqlalchemy import text

from loadtest.procs import Proc, clean_env
from loadtest.report import collect, write
from poller import migrate
from poller.db import sync_engine
from poller.embedded import EmbeddedPostgres, EmbeddedRedis, free_port
from poller.endpoints import create_endpoint, new_secret

FAULT_FLAGS = ["--fail-rate", "0.1", "--drop-after-process-rate", "0.02", "--latency", "0.05"]


def _args() -> argparse.Namespace:
    env = os.environ.get
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=int(env("LOADTEST_USERS", "20")))
    parser.add_argument("--spawn-rate", type=float, default=float(env("LOADTEST_SPAWN_RATE", "10")))
    parser.add_argument("--duration", type=int, default=int(env("LOADTEST_DURATION", "60")))
    parser.add_argument("--pollers", type=int, default=int(env("LOADTEST_POLLERS", "2")))
    parser.add_argument("--batch-size", type=int, default=int(env("LOADTEST_BATCH_SIZE", "100")))
    parser.add_argument("--concurrency", type=int, default=int(env("LOADTEST_CONCURRENCY", "64")))
    parser.add_argument("--drain", type=int, default=int(env("LOADTEST_DRAIN", "120")))
    parser.add_argument("--faults", action="store_true", default=env("FAULTS", "") in ("1", "true"))
    parser.add_argument("--out", type=Path, default=Path(env("LOADTEST_OUT", "loadtest/out")))
    parser.add_argument("--ack-and-discard", type=int, default=0, help=argparse.SUPPRESS)
    return parser.parse_args()


@contextlib.contextmanager
def _servers(tmp: Path) -> Iterator[tuple[str, str]]:
    """(database URL, Redis URL): configured ones, else embedded ones for this run."""
    db, redis = os.environ.get("POLLER_DATABASE_URL"), os.environ.get("POLLER_REDIS_URL")
    pg = None if db else EmbeddedPostgres(tmp, durable=False)
    rs = None if redis else EmbeddedRedis(tmp)
    try:
        yield (db or pg.start()), (redis or rs.start())  # type: ignore[union-attr]
    finally:
        if rs is not None:
            rs.stop()
        if pg is not None:
            pg.stop()


def _killer(pollers: list[Proc], stop: threading.Event, kills: list[int]) -> None:
    """Every 10 s: SIGKILL one poller, start it again."""
    while not stop.wait(10):
        victim = random.choice(pollers)
        victim.kill()
        kills.append(1)
        victim.restart()


def _open_messages(engine: object) -> int:
    with engine.connect() as conn:  # type: ignore[attr-defined]
        return int(
            conn.execute(
                text("SELECT count(*) FROM poller_outbox WHERE status IN ('pending', 'in_flight')")
            ).scalar_one()
        )


def main() -> None:
    args = _args()
    args.out.mkdir(parents=True, exist_ok=True)
    settings = {k: v for k, v in vars(args).items() if k not in ("out", "ack_and_discard")}
    with (
        tempfile.TemporaryDirectory(prefix="poller-loadtest-") as tmp_name,
        _servers(Path(tmp_name)) as (db_url, redis_url),
    ):
        tmp = Path(tmp_name)
        migrate.upgrade(db_url)
        engine = sync_engine(db_url)
        procs: list[Proc] = []
        stop_killer, kills = threading.Event(), []
        try:
            secret = new_secret()
            flags = [
                *(FAULT_FLAGS if args.faults else []),
                "--ack-and-discard",
                str(args.ack_and_discard),
            ]
            receiver = Proc(
                ["receiver", "--port", "0", "--secret", secret, *flags],
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
                ["loadtest.app:app", "--port", str(app_port), "--log-level", "warning"],
                clean_env(POLLER_DATABASE_URL=db_url),
                tmp / "app.log",
                module="uvicorn",
            )
            procs.append(app)
            poller_env = clean_env(
                POLLER_DATABASE_URL=db_url,
                POLLER_REDIS_URL=redis_url,
                POLLER_ALLOW_PRIVATE_TARGETS="true",
                POLLER_BATCH_SIZE=str(args.batch_size),
                POLLER_CONCURRENCY=str(args.concurrency),
                POLLER_LOG_FORMAT="json",
                POLLER_LEASE_TTL="3",
                POLLER_CLAIM_LEASE="8",
                POLLER_REQUEST_TIMEOUT="3",
                POLLER_SWEEP_INTERVAL="1",
                POLLER_RETRY_SCHEDULE="[0.5, 1, 2, 4]",
                POLLER_CIRCUIT_COOLDOWN="1",
                POLLER_CIRCUIT_COOLDOWN_MAX="4",
            )
            pollers = [
                Proc(["run", "--id", f"poller-{n}"], poller_env, tmp / f"poller-{n}.log")
                for n in range(args.pollers)
            ]
            procs.extend(pollers)
            _wait_healthy(f"http://127.0.0.1:{app_port}/healthz")
            if args.faults:
                threading.Thread(
                    target=_killer, args=(pollers, stop_killer, kills), daemon=True
                ).start()
            began = time.monotonic()
            locust = Proc(
                [
                    "-f",
                    "loadtest/locustfile.py",
                    "--headless",
                    "-u",
                    str(args.users),
                    "-r",
                    str(args.spawn_rate),
                    "-t",
                    f"{args.duration}s",
                    "--host",
                    f"http://127.0.0.1:{app_port}",
                    "--html",
                    str(args.out / "locust.html"),
                    "--csv",
                    str(args.out / "locust"),
                    "--only-summary",
                ],
                clean_env(LOADTEST_RECEIVER_URL=receiver_url),
                args.out / "locust.log",
                module="locust",
            )
            procs.append(locust)
            locust.popen.wait(timeout=args.duration + 120)
            duration = time.monotonic() - began
            stop_killer.set()
            deadline = time.monotonic() + args.drain
            while _open_messages(engine) and time.monotonic() < deadline:
                time.sleep(0.5)
            stats = httpx.get(f"{receiver_url}/stats", timeout=30).json()
            receipts = httpx.get(f"{receiver_url}/receipts", timeout=60).json()
            figures = collect(engine, stats, receipts, duration, len(kills))
        finally:
            stop_killer.set()
            for proc in reversed(procs):
                proc.stop()
            engine.dispose()
    broken = write(figures, args.out, settings)
    print((args.out / "report.md").read_text())
    if broken:
        raise SystemExit(1)


def _wait_healthy(url: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=1).status_code == 200:
                return
        time.sleep(0.1)
    raise SystemExit(f"{url} did not become healthy")


if __name__ == "__main__":
    main()
