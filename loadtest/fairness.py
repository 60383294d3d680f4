"""Whether one tenant's slow receivers starve another tenant's fast one.

    python -m loadtest.fairness [--slow-endpoints 200] [--backlog 4000] [--latency 2]
                                [--messages 100] [--rate 20] [--env NAME=VALUE ...]

One `poller run` on its defaults (``--env`` adds settings), two receivers of their own:
tenant acme's ``--slow-endpoints`` endpoints answer after ``--latency`` seconds,
tenant globex's one endpoint at once. First globex alone: ``--messages`` messages
committed at ``--rate`` a second, each one's commit→receipt noted. Then acme's
``--backlog`` messages (spread over its endpoints) are committed, and once the
poller is holding them, globex's messages again at the same rate, while acme's are
being served.

Printed: globex's commit→receipt p50, p90 and max, alone and beside acme, how many
arrived within 60 s, acme's deliveries a second meanwhile, its messages in flight at
the end and the poller's peak memory; and the target: beside acme, globex's p50
within 2× of alone plus 50 ms, and all of its messages within a minute.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import text
from sqlalchemy.orm import Session

from loadtest.bench_db import fresh_database, server_url
from loadtest.deliveries import start_receiver
from loadtest.procs import Proc, clean_env
from poller import Message, enqueue_many
from poller.endpoints.registry import create_endpoint, new_secret
from poller.store.db import sync_engine

WITHIN = 60.0  # seconds: every one of the fast tenant's messages arrives within this


def _count(engine: Any, sql: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(sql)).scalar_one())


def _paced(engine: Any, prefix: str, messages: int, rate: float) -> dict[str, float]:
    """globex's messages, one a transaction, at ``rate`` a second; each key's commit time."""
    committed: dict[str, float] = {}
    began = time.monotonic()
    for n in range(messages):
        while time.monotonic() - began < n / rate:
            time.sleep(0.002)
        key = f"{prefix}:{n}"
        with Session(engine) as session, session.begin():
            enqueue_many(session, [Message("globex", "order.created", {"n": n}, key)])
        committed[key] = time.time()
    return committed


def _receipts(receiver_url: str, committed: dict[str, float], deadline: float) -> list[float]:
    """Commit→receipt of each committed key, in seconds, once all arrived or at the
    deadline (the missing ones as infinity)."""
    while True:
        applied = httpx.get(f"{receiver_url}/receipts", timeout=30).json()
        if all(key in applied for key in committed) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    return [applied.get(key, float("inf")) - at for key, at in committed.items()]


def _figures(lags: list[float]) -> dict[str, float]:
    ordered = sorted(lags)
    return {
        "p50": statistics.median(ordered),
        "p90": ordered[int(0.9 * (len(ordered) - 1))],
        "max": ordered[-1],
        "within": sum(1 for lag in ordered if lag <= WITHIN),
    }


def _peak_rss_mb(pid: int) -> float:
    """The process's peak resident memory (VmHWM), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def run(admin_url: str, tmp: Path, args: Any) -> dict[str, Any]:
    secret = new_secret()
    slow, slow_url = start_receiver(tmp, secret, "slow", latency=args.latency)
    fast, fast_url = start_receiver(tmp, secret, "fast")
    url = fresh_database(admin_url, "bench_fairness")
    engine = sync_engine(url)
    with engine.begin() as conn:
        create_endpoint(conn, "globex", f"{fast_url}/globex", secret=secret, tenant="globex",
                        allow_private=True)  # fmt: skip
        for i in range(args.slow_endpoints):
            create_endpoint(conn, f"acme-{i}", f"{slow_url}/acme/{i}", secret=secret,
                            tenant="acme", allow_private=True)  # fmt: skip
    env = clean_env(POLLER_DATABASE_URL=url, POLLER_ALLOW_PRIVATE_TARGETS="true",
                    **dict(pair.split("=", 1) for pair in args.env))  # fmt: skip
    poller = Proc(["run", "--id", "fairness"], env, tmp / "poller.log")
    found: dict[str, Any] = {}
    try:
        poller.wait_for("starting")
        alone = _paced(engine, "alone", args.messages, args.rate)
        found["alone"] = _figures(_receipts(fast_url, alone, time.monotonic() + WITHIN))
        with Session(engine) as session, session.begin():
            enqueue_many(session, [
                Message(f"acme-{n % args.slow_endpoints}", "order.created", {"n": n}, f"a:{n}")
                for n in range(args.backlog)
            ])  # fmt: skip
        in_flight = "SELECT count(*) FROM poller_outbox WHERE status = 'in_flight'"
        deadline = time.monotonic() + 30
        while _count(engine, in_flight) < min(args.backlog, 50) and time.monotonic() < deadline:
            time.sleep(0.05)
        delivered = "SELECT count(*) FROM poller_outbox WHERE status = 'delivered'"
        before, began = _count(engine, delivered), time.monotonic()
        beside = _paced(engine, "beside", args.messages, args.rate)
        found["peak"] = _count(engine, in_flight)
        found["beside"] = _figures(_receipts(fast_url, beside, time.monotonic() + WITHIN))
        found["rss"] = _peak_rss_mb(poller.popen.pid)
        elapsed = time.monotonic() - began
        found["acme_rate"] = (_count(engine, delivered) - before - args.messages) / elapsed
    finally:
        poller.stop()
        slow.stop()
        fast.stop()
        engine.dispose()
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--slow-endpoints", type=int, default=200)
    parser.add_argument("--backlog", type=int, default=4000)
    parser.add_argument("--latency", type=float, default=2.0)
    parser.add_argument("--messages", type=int, default=100)
    parser.add_argument("--rate", type=float, default=20.0)
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="poller-fairness-") as tmpdir, server_url() as admin:
        found = run(admin, Path(tmpdir), args)
    alone, beside = found["alone"], found["beside"]
    goal = 2 * alone["p50"] + 0.05
    print(
        f"tenant acme: {args.slow_endpoints} endpoints answering in {args.latency:g} s, "
        f"{args.backlog:,} messages; tenant globex: 1 endpoint, {args.messages} messages "
        f"at {args.rate:g}/s\n"
        f"  {'globex':<14} {'p50 ms':>9} {'p90 ms':>9} {'max ms':>9} {'within 60 s':>12}"
    )
    for name, figures in (("alone", alone), ("beside acme", beside)):
        print(
            f"  {name:<14} {figures['p50'] * 1000:>9,.1f} {figures['p90'] * 1000:>9,.1f} "
            f"{figures['max'] * 1000:>9,.0f} {figures['within']:>8} of {args.messages}"
        )
    print(f"  acme meanwhile: {found['acme_rate']:,.0f} deliveries/s, "
          f"{found['peak']:,} messages in flight at the end; the poller's peak RSS "
          f"{found['rss']:,.0f} MB")  # fmt: skip
    met = beside["p50"] <= goal and beside["within"] == args.messages
    print(
        f"  target: p50 beside acme <= 2 x alone + 50 ms ({goal * 1000:,.1f} ms) and all "
        f"within 60 s: {'met' if met else 'NOT met'} "
        f"({beside['p50'] / alone['p50']:.1f}x alone)"
    )


if __name__ == "__main__":
    main()
