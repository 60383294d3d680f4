"""A big backlog: 1,000,000 due messages over 100 endpoints, drained by one poller.

    python -m loadtest.backlog [--messages 1000000] [--baseline 20000] [--endpoints 100]
                               [--history 5000000] [--purge-seconds 60] [--deadline 900]

1. **baseline**: ``--baseline`` due messages drained by a fresh `poller run`;
   its rate is the yardstick of this run;
2. **backlog**: ``--messages`` due messages, then a fresh `poller run` drains
   them. Every 2 s: deliveries (the receiver's count), the poller's RSS
   (/proc) and its claim latency (``webhook_poller_claim_duration_seconds``,
   mean over the window). Reported: the drain rate against the baseline, RSS
   at 10 s, at its peak and at the end, and the first and last quarter's
   rates and claim latencies (flat = the backlog's size costs nothing);
3. **retention purge**: ``--history`` delivered rows past retention (each with
   one attempt row) are added, and the poller's own :class:`Purger` runs for
   ``--purge-seconds``: rows purged per second, and what that gives in service
   (``PURGE_BUDGET`` of each ``POLLER_SWEEP_INTERVAL``), against the drain rate.

Rows are inserted with ``INSERT … SELECT generate_series`` straight into the
tables (what enqueue would write; the enqueue path has its own benchmark), so
the run measures the drain and the purge, not the loading. Targets (issue 16):
RSS ≤ 150 MB and flat, drain ≥ 0.9× the baseline, purge ≥ the drain rate.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import Engine, text

from loadtest.bench_db import fresh_database, server_url
from loadtest.deliveries import start_receiver
from loadtest.procs import Proc, clean_env
from poller.endpoints.registry import create_endpoint, new_secret
from poller.local.embedded import free_port
from poller.service import maintenance
from poller.store.db import async_engine, sync_engine

INSERT_DUE = """
INSERT INTO poller_outbox (endpoint_id, bucket, event_type, payload, idempotency_key, max_attempts)
SELECT e.id, e.bucket, 'bench.backlog',
       json_build_object('n', g, 'pad', repeat('x', 200)), :prefix || g, 5
FROM generate_series(CAST(:first AS bigint), CAST(:last AS bigint)) AS g
JOIN poller_endpoints e ON e.name = 'e' || lpad((g % CAST(:endpoints AS bigint))::text, 3, '0')
"""
INSERT_HISTORY = """
WITH rows AS (
    INSERT INTO poller_outbox (endpoint_id, bucket, event_type, payload, idempotency_key,
                               max_attempts, status, attempts, created_at, updated_at,
                               delivered_at)
    SELECT e.id, e.bucket, 'bench.history', json_build_object('n', g), 'h:' || g, 5,
           'delivered', 1, now() - interval '9 days', now() - interval '8 days',
           now() - interval '8 days' + g * interval '1 microsecond'
    FROM generate_series(CAST(:first AS bigint), CAST(:last AS bigint)) AS g
    JOIN poller_endpoints e ON e.name = 'e' || lpad((g % CAST(:endpoints AS bigint))::text, 3, '0')
    RETURNING id
)
INSERT INTO poller_delivery_attempts (message_id, attempt, kind, outcome, status_code,
                                      finished_at, duration_ms)
SELECT id, 1, 'send', 'delivered', 200, now() - interval '8 days', 3.0 FROM rows
"""
CHUNK = 250_000


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--baseline", type=int, default=20_000)
    parser.add_argument("--endpoints", type=int, default=100)
    parser.add_argument("--history", type=int, default=5_000_000)
    parser.add_argument("--purge-seconds", type=float, default=60.0)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--deadline", type=float, default=900.0, help="seconds per drain")
    return parser.parse_args()


def _insert(engine: Engine, sql: str, count: int, endpoints: int, **params: Any) -> float:
    """Rows per second of inserting ``count`` rows in chunks (one transaction each)."""
    began = time.monotonic()
    for first in range(1, count + 1, CHUNK):
        last = min(count, first + CHUNK - 1)
        with engine.begin() as conn:
            conn.execute(
                text(sql), {"first": first, "last": last, "endpoints": endpoints, **params}
            )
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE poller_outbox"))
        conn.execute(text("VACUUM ANALYZE poller_delivery_attempts"))
    return count / (time.monotonic() - began)


def _rss_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    found = re.search(r"VmRSS:\s+(\d+) kB", status)
    return int(found.group(1)) / 1024 if found else 0.0


def _claim_seconds(metrics_url: str) -> tuple[float, float]:
    """(sum, count) of the poller's claim duration histogram."""
    body = httpx.get(metrics_url, timeout=5).text
    total = re.search(r"^webhook_poller_claim_duration_seconds_sum ([0-9.e+-]+)$", body, re.M)
    count = re.search(r"^webhook_poller_claim_duration_seconds_count ([0-9.e+-]+)$", body, re.M)
    return (float(total.group(1)) if total else 0.0, float(count.group(1)) if count else 0.0)


def drain(
    tmp: Path, url: str, receiver_url: str, expected: int, args: argparse.Namespace, name: str
) -> dict[str, Any]:
    """Start a poller, wait until the receiver has ``expected`` keys, sample on the way."""
    port = free_port()
    poller = Proc(
        ["run", "--id", name],
        clean_env(
            POLLER_DATABASE_URL=url,
            POLLER_CONCURRENCY=str(args.concurrency),
            POLLER_ALLOW_PRIVATE_TARGETS="true",
            POLLER_METRICS_ADDR=f"127.0.0.1:{port}",
            POLLER_LOG_FORMAT="json",
        ),
        tmp / f"{name}.log",
    )
    samples: list[dict[str, float]] = []
    try:
        began = time.monotonic()
        first_at: float | None = None
        start_count = int(httpx.get(f"{receiver_url}/stats", timeout=10).json()["unique"])
        while True:
            time.sleep(0.1 if first_at is None else 2.0)
            now = time.monotonic()
            unique = int(httpx.get(f"{receiver_url}/stats", timeout=10).json()["unique"])
            if first_at is None and unique > start_count:
                first_at = now
            if first_at is not None:
                claim = _claim_seconds(f"http://127.0.0.1:{port}/metrics")
                samples.append(
                    {"t": now - first_at, "delivered": unique - start_count,
                     "rss_mb": _rss_mb(poller.popen.pid), "claim_sum": claim[0],
                     "claim_count": claim[1]}
                )  # fmt: skip
            if unique - start_count >= expected or now - began > args.deadline:
                break
    finally:
        poller.stop()
    return _drain_figures(samples, expected)


def _drain_figures(samples: list[dict[str, float]], expected: int) -> dict[str, Any]:
    last = samples[-1]
    quarter = max(1, len(samples) // 4)

    def rate(part: list[dict[str, float]]) -> float:
        return (part[-1]["delivered"] - part[0]["delivered"]) / max(
            1e-9, part[-1]["t"] - part[0]["t"]
        )

    def claim_ms(part: list[dict[str, float]]) -> float:
        rounds = part[-1]["claim_count"] - part[0]["claim_count"]
        return 1000 * (part[-1]["claim_sum"] - part[0]["claim_sum"]) / max(1.0, rounds)

    head, tail = samples[: quarter + 1], samples[-quarter - 1 :]
    at_10 = next((s["rss_mb"] for s in samples if s["t"] >= 10), samples[0]["rss_mb"])
    return {
        "delivered": int(last["delivered"]),
        "complete": last["delivered"] >= expected,
        "seconds": last["t"],
        "per_second": last["delivered"] / max(1e-9, last["t"]),
        "first_quarter_per_second": rate(head) if len(head) > 1 else None,
        "last_quarter_per_second": rate(tail) if len(tail) > 1 else None,
        "claim_ms_first_quarter": claim_ms(head) if len(head) > 1 else None,
        "claim_ms_last_quarter": claim_ms(tail) if len(tail) > 1 else None,
        "rss_mb_at_10s": at_10,
        "rss_mb_peak": max(s["rss_mb"] for s in samples),
        "rss_mb_end": last["rss_mb"],
    }


async def purge_rate(url: str, seconds: float) -> tuple[int, float]:
    """(rows purged, seconds spent) by the service's Purger, run back to back."""
    engine = async_engine(url)
    purger = maintenance.Purger(engine, delivered_age=7 * 86400, failed_age=30 * 86400)
    purged, began = 0, time.monotonic()
    try:
        while time.monotonic() - began < seconds:
            done = await purger.run_once()
            purged += done
            if not done:
                break
    finally:
        await engine.dispose()
    return purged, time.monotonic() - began


def main() -> None:
    args = _args()
    with tempfile.TemporaryDirectory(prefix="poller-backlog-") as tmp_name, server_url() as admin:
        tmp = Path(tmp_name)
        url = fresh_database(admin, "poller_backlog")
        engine = sync_engine(url)
        secret = new_secret()
        receiver, receiver_url = start_receiver(tmp, secret, "receiver")
        try:
            with engine.begin() as conn:
                for i in range(args.endpoints):
                    create_endpoint(
                        conn, f"e{i:03d}", f"{receiver_url}/e{i:03d}", secret=secret,
                        allow_private=True,
                    )  # fmt: skip
            _insert(engine, INSERT_DUE, args.baseline, args.endpoints, prefix="base:")
            small = drain(tmp, url, receiver_url, args.baseline, args, "baseline")
            print(
                f"baseline: {args.baseline:,} drained at {small['per_second']:,.0f}/s", flush=True
            )
            loading = _insert(engine, INSERT_DUE, args.messages, args.endpoints, prefix="big:")
            print(
                f"backlog: {args.messages:,} due rows inserted at {loading:,.0f} rows/s", flush=True
            )
            big = drain(tmp, url, receiver_url, args.messages, args, "backlog")
            _insert(engine, INSERT_HISTORY, args.history, args.endpoints)
            purged, spent = asyncio.run(purge_rate(url, args.purge_seconds))
        finally:
            receiver.stop()
            engine.dispose()
    _report(args, small, big, purged, spent)


def _report(
    args: argparse.Namespace, small: dict[str, Any], big: dict[str, Any], purged: int, spent: float
) -> None:
    raw = purged / spent if spent else 0.0
    in_service = raw * maintenance.PURGE_BUDGET / 5.0
    ratio = big["per_second"] / small["per_second"] if small["per_second"] else 0.0

    def ms(value: float | None) -> str:
        return "—" if value is None else f"{value:.1f}"

    print(
        f"\nBacklog of {args.messages:,} due messages over {args.endpoints} endpoints, one poller"
        f" ({args.concurrency} in flight)\n"
        f"  drained {big['delivered']:,} in {big['seconds']:.0f} s: {big['per_second']:,.0f}/s"
        f" = {ratio:.2f}x the {args.baseline:,}-message baseline ({small['per_second']:,.0f}/s)"
        f"{'' if big['complete'] else '  (DEADLINE: not all delivered)'}\n"
        f"  first / last quarter: {big['first_quarter_per_second'] or 0:,.0f} / "
        f"{big['last_quarter_per_second'] or 0:,.0f} deliveries/s;"
        f" claim round {ms(big['claim_ms_first_quarter'])} / {ms(big['claim_ms_last_quarter'])} ms"
        f" (baseline {ms(small['claim_ms_first_quarter'])} ms)\n"
        f"  poller RSS: {big['rss_mb_at_10s']:.0f} MB at 10 s, peak {big['rss_mb_peak']:.0f} MB,"
        f" end {big['rss_mb_end']:.0f} MB (target <= 150 MB, flat)\n"
        f"Retention purge with {args.history:,} rows of history (+ their attempts):\n"
        f"  {purged:,} rows in {spent:.0f} s = {raw:,.0f} rows/s back to back;"
        f" {in_service:,.0f} rows/s in service ({maintenance.PURGE_BUDGET:.0f} s of each 5 s sweep)"
        f" = {in_service / big['per_second'] if big['per_second'] else 0:.2f}x the drain rate"
    )


if __name__ == "__main__":
    main()
