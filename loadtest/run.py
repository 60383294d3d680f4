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
import os
import random
import tempfile
import threading
import time
from pathlib import Path

import httpx
from sqlalchemy import text

from loadtest.procs import Proc, clean_env
from loadtest.report import collect, write
from loadtest.stack import servers, stack
from poller.store.db import sync_engine

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
    flags = (*(FAULT_FLAGS if args.faults else []), "--ack-and-discard", str(args.ack_and_discard))
    with (
        tempfile.TemporaryDirectory(prefix="poller-loadtest-") as tmp_name,
        servers(Path(tmp_name)) as running,
        stack(
            Path(tmp_name),
            running,
            pollers=args.pollers,
            batch_size=args.batch_size,
            concurrency=args.concurrency,
            receiver_flags=flags,
        ) as procs,
    ):
        engine = sync_engine(running.database_url)
        stop_killer, kills = threading.Event(), []
        locust: Proc | None = None
        try:
            if args.faults:
                threading.Thread(
                    target=_killer, args=(procs.pollers, stop_killer, kills), daemon=True
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
                    procs.app_url,
                    "--html",
                    str(args.out / "locust.html"),
                    "--csv",
                    str(args.out / "locust"),
                    "--only-summary",
                ],
                clean_env(LOADTEST_RECEIVER_URL=procs.receiver_url),
                args.out / "locust.log",
                module="locust",
            )
            locust.popen.wait(timeout=args.duration + 120)
            duration = time.monotonic() - began
            stop_killer.set()
            deadline = time.monotonic() + args.drain
            while _open_messages(engine) and time.monotonic() < deadline:
                time.sleep(0.5)
            stats = httpx.get(f"{procs.receiver_url}/stats", timeout=30).json()
            receipts = httpx.get(f"{procs.receiver_url}/receipts", timeout=60).json()
            figures = collect(engine, stats, receipts, duration, len(kills))
        finally:
            stop_killer.set()
            if locust is not None:
                locust.stop()
            engine.dispose()
    broken = write(figures, args.out, settings)
    print((args.out / "report.md").read_text())
    if broken:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
