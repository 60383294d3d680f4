"""Ordered delivery's cost: drain rates of one `poller run`, unordered vs ordered, same run.

    python -m loadtest.ordered [--messages 20000] [--keys 1000] [--blocked 200]

1. unordered: --messages committed at once, time until all are delivered;
2. ordered: as many over --keys ordering keys (each key's messages one at a
   time, in order) — target ≥ 0.8 x the unordered rate;
3. unordered beside blocked keys: --blocked keys stopped behind a failed head,
   50 messages waiting behind each, then an unordered drain — target ≥ 0.9 x
   the unordered rate (a stuck key must not slow anything else).

1 and 2 alternate for --rounds rounds, then 3 runs --rounds times; medians.

The receiver counts order violations; the run fails if there is one. Figures
are deliveries/s and their ratios to the unordered rate of the same run.
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
from loadtest.deliveries import _payload, start_poller, start_receiver
from loadtest.fixtures import insert_waiting
from loadtest.procs import Proc
from poller import Message, enqueue_many
from poller.endpoints.registry import new_secret
from poller.store.db import sync_engine


def _applied(receiver_url: str) -> int:
    """Messages the receiver applied: asked of it, not counted in a growing table (a
    count(*) every few ms would load the database more the longer the run goes)."""
    return int(httpx.get(f"{receiver_url}/stats").json()["applied"])


def drain(engine: Any, receiver_url: str, batch: list[Message], timeout: float) -> float:
    """Commit ``batch`` in one transaction; deliveries/s until the receiver applied all."""
    before = _applied(receiver_url)
    with Session(engine) as session, session.begin():
        for start in range(0, len(batch), 5000):
            enqueue_many(session, batch[start : start + 5000])
    began = time.perf_counter()
    deadline = time.monotonic() + timeout
    while (done := _applied(receiver_url) - before) < len(batch):
        if time.monotonic() > deadline:
            raise SystemExit(f"only {done} of {len(batch)} delivered")
        time.sleep(0.05)
    return len(batch) / (time.perf_counter() - began)


def block_keys(engine: Any, keys: int) -> None:
    """``keys`` ordering keys with a failed head and 50 messages waiting behind each."""
    with engine.begin() as conn:
        endpoint_id, bucket = conn.execute(
            text("SELECT id, bucket FROM poller_endpoints WHERE name = 'bench'")
        ).one()
        insert_waiting(conn, endpoint_id, bucket, keys * 51, keys=keys)
        conn.execute(
            text(
                "UPDATE poller_outbox SET status = 'failed', failed_at = now(), "
                "last_error = 'HTTP 500' WHERE id IN (SELECT head_id FROM poller_ordering_keys "
                "WHERE ordering_key LIKE 'key:%')"
            )
        )
        conn.execute(
            text(
                "UPDATE poller_ordering_keys SET blocked_since = now() "
                "WHERE ordering_key LIKE 'key:%'"
            )
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--keys", type=int, default=1_000)
    parser.add_argument("--blocked", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args()
    secret = new_secret()
    n, keys = args.messages, args.keys
    with tempfile.TemporaryDirectory(prefix="poller-ordered-") as tmp_name, server_url() as admin:
        tmp = Path(tmp_name)
        url = fresh_database(admin, "poller_bench_ordered")
        procs: list[Proc] = []
        try:
            receiver, receiver_url = start_receiver(tmp, secret, "receiver")
            procs.append(receiver)
            engine = sync_engine(url)
            procs.append(start_poller(tmp, engine, url, receiver_url, secret, args.concurrency))

            def free(tag: str) -> list[Message]:
                return [Message("bench", "e.v", _payload(i), f"{tag}:{i}") for i in range(n)]

            def ordered_batch(tag: str) -> list[Message]:
                return [
                    Message("bench", "e.v", _payload(i), f"{tag}:{i}", ordering_key=f"k{i % keys}")
                    for i in range(n)
                ]

            def run(label: str, batch: list[Message]) -> float:
                rate = drain(engine, receiver_url, batch, args.timeout)
                with engine.connect() as conn:  # the next phase starts on a vacuumed table
                    conn.execution_options(isolation_level="AUTOCOMMIT").execute(
                        text("VACUUM ANALYZE poller_outbox")
                    )
                print(f"  {label}: {rate:,.0f} deliveries/s", flush=True)
                return rate

            run("warm-up", free("warm")[: n // 4])
            # Phases alternate and repeat, and each figure is a median, so the table
            # growing over the run and this machine's noise weigh on both sides alike.
            unordered, ordered, beside = [], [], []
            for r in range(args.rounds):
                unordered.append(run(f"unordered #{r + 1}", free(f"free{r}")))
                ordered.append(run(f"ordered #{r + 1}", ordered_batch(f"ord{r}")))
            block_keys(engine, args.blocked)
            with engine.connect() as conn:
                conn.execution_options(isolation_level="AUTOCOMMIT").execute(text("VACUUM ANALYZE"))
            for r in range(args.rounds):
                beside.append(run(f"unordered beside blocked keys #{r + 1}", free(f"b{r}")))
            stats = httpx.get(f"{receiver_url}/stats").json()
            u, o, b = (
                statistics.median(unordered),
                statistics.median(ordered),
                statistics.median(beside),
            )
            print(
                f"medians of {args.rounds} drains of {n:,} messages each:\n"
                f"unordered: {u:,.0f} deliveries/s\n"
                f"ordered over {keys:,} keys: {o:,.0f} deliveries/s "
                f"({o / u:.2f} x unordered; target 0.8)\n"
                f"unordered beside {args.blocked} blocked keys ({args.blocked * 50:,} waiting): "
                f"{b:,.0f} deliveries/s ({b / u:.2f} x; target 0.9)\n"
                f"receiver: {stats['ordered']:,} ordered applied, "
                f"{stats['order_violations']} order violations",
                flush=True,
            )
            if stats["order_violations"]:
                raise SystemExit("order violations at the receiver")
        finally:
            for proc in reversed(procs):
                proc.stop()


if __name__ == "__main__":
    main()
