"""Claim + complete throughput through poller.rows.claims, beside the raw psycopg ceiling.

    python -m loadtest.claims [--rows 200000] [--batch 100] [--connections 1 4]

For each connection count, the same queue (ROWS due rows) is drained in turns:
once by processes using :class:`poller.rows.claims.Claims` as the service does (a
claim and a completion of deliveries are each one statement on a connection of
their own; JUDGE_HEALTH in a transaction when it would change something) and
once by processes sending the *same statements* through plain psycopg. Each process
holds one connection and loops claim → complete (delivered) until the queue is
empty. Figures are rows/s; the ratio is
poller / raw, measured in the same run on the same server (median of
--repeat interleaved runs each).

Then the claim statement's median time is measured with no history and with
1,000,000 delivered rows of history (1,000 due rows in both cases): the
partial index should keep the two close.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import statistics
import time
from typing import Any

import psycopg
from sqlalchemy import text

from loadtest.bench_db import fresh_database, server_url
from loadtest.fixtures import insert_due, insert_history
from poller.endpoints.registry import create_endpoint
from poller.rows.claims import ALL_BUCKETS_LITERAL, LEAST_ID, NO_BUCKET, Claims
from poller.rules.health import HealthPolicy
from poller.rules.outcomes import delivered
from poller.store import queries
from poller.store.db import async_engine, autocommit_connection, libpq_url, sync_engine

# The same text poller.rows.claims sends to the driver since it skips SQLAlchemy there
# (poller/store/db.py fetch): what differs between the two columns is everything around it.
RAW_CLAIM = queries.CLAIM_BATCH.psycopg
RAW_COMPLETE = queries.COMPLETE_BATCH.psycopg
RAW_JUDGE = queries.JUDGE_HEALTH.psycopg
HEALTH = HealthPolicy().params()


def _seed(url: str, rows: int) -> None:
    engine = sync_engine(url)
    with engine.begin() as conn:
        conn.execute(text("TRUNCATE poller_outbox, poller_delivery_attempts"))
        existing = conn.execute(text("SELECT id, bucket FROM poller_endpoints")).first()
        if existing is None:
            made = create_endpoint(conn, "bench", "http://127.0.0.1:9/", allow_private=True)
            existing = (made.endpoint.id, made.endpoint.bucket)
        insert_due(conn, existing[0], existing[1], rows, pad=100)
    with engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").execute(text("VACUUM ANALYZE"))
    engine.dispose()


async def _drain_poller(url: str, batch: int, start: Any) -> int:
    engine = async_engine(url, pool_size=1, max_overflow=0)
    claims = Claims(engine, poller_id="bench", claim_lease=60, follow_ups_apart=True)
    await claims.claim_batch(limit=0)
    # The endpoint cache the Claimer keeps: endpoints are read once, not with every claim.
    versions: dict[int, Any] = {}
    start.wait()
    done = 0
    while messages := (await claims.claim(batch, endpoint_versions=versions)).messages:
        versions.update((m.endpoint_id, m.endpoint_updated_at) for m in messages)
        await claims.complete([delivered(m, status_code=200) for m in messages])
        done += len(messages)
    await claims.close()
    await engine.dispose()
    return done


async def _drain_raw(url: str, batch: int, start: Any) -> int:
    conn = await psycopg.AsyncConnection.connect(libpq_url(url), autocommit=False)
    alone = await autocommit_connection(libpq_url(url))  # the claim's own session, as Claims
    completing = await autocommit_connection(libpq_url(url), generic_plans=False)
    claim = {
        "buckets": ALL_BUCKETS_LITERAL,
        "limit": batch,
        "claimed_by": "bench",
        "claim_lease": 60.0,
        "in_flight": "[]",
        "default_max_in_flight": 1000,
        "full_tenants": [],
        "after_bucket": NO_BUCKET,
        "after": LEAST_ID,
        "fences": None,
        "shards": 1,
    }
    start.wait()
    done = 0
    while True:
        async with alone.cursor() as cur:  # one statement: it needs no transaction
            await cur.execute(RAW_CLAIM, claim)
            rows = [r for r in await cur.fetchall() if r[0] is not None]
        if not rows:
            break
        # The same JSON a hand-written client would send (poller.rules.outcomes.OUTCOME_COLUMNS,
        # then started_at), built as cheaply as possible.
        outcomes = [
            [r[0], r[8], r[6], "delivered", "delivered", None, False, None, "send", None, 200]
            for r in rows
        ]
        params = {"outcomes": json.dumps(outcomes), "poller_id": "bench", **HEALTH}
        n = len(rows)
        # A correct client reads which completions the fence refused, as poller.rows.claims does,
        # and tells the endpoint's health what the sends did (the breaker is shared) when
        # the completion says its health row is not one of a healthy endpoint.
        async with completing.cursor() as cur:
            await cur.execute(RAW_COMPLETE, params)
            applied = await cur.fetchall()
        stale = n - len(applied)
        if applied and not (applied[0][4] and not applied[0][5]):
            async with conn.cursor() as cur:
                signals = [{"endpoint_id": applied[0][1], "ok": len(applied), "bad": 0}]
                await cur.execute(RAW_JUDGE, {"signals": json.dumps(signals), **HEALTH})
            await conn.commit()
        if stale:
            raise SystemExit(f"raw: {stale} completions refused")
        done += n
    await conn.close()
    await alone.close()
    await completing.close()
    return done


def _worker(mode: str, url: str, batch: int, start: Any, results: Any) -> None:
    drain = _drain_poller if mode == "poller" else _drain_raw
    results.put(asyncio.run(drain(url, batch, start)))


def measure(mode: str, url: str, rows: int, batch: int, connections: int) -> float:
    """Rows/s for ``connections`` processes draining ``rows`` due rows."""
    _seed(url, rows)
    ctx = mp.get_context("spawn")
    start, results = ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(target=_worker, args=(mode, url, batch, start, results))
        for _ in range(connections)
    ]
    for proc in procs:
        proc.start()
    time.sleep(1.5)  # let every process import and connect (not timed)
    began = time.perf_counter()
    start.set()
    total = sum(results.get(timeout=600) for _ in procs)
    elapsed = time.perf_counter() - began
    for proc in procs:
        proc.join(timeout=30)
    if total != rows:
        raise SystemExit(f"{mode}: drained {total} rows, expected {rows}")
    return rows / elapsed


def claim_median_ms(url: str, history: int, due: int = 1000, runs: int = 40) -> float:
    """Median time of one CLAIM_BATCH (limit 100), rolled back so every run sees the same rows."""
    engine = sync_engine(url)
    with engine.begin() as conn:
        conn.execute(text("TRUNCATE poller_outbox, poller_delivery_attempts"))
        ep_id, bucket = conn.execute(text("SELECT id, bucket FROM poller_endpoints")).one()
        if history:
            insert_history(conn, ep_id, bucket, history)
        insert_due(conn, ep_id, bucket, due)
    with engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").execute(text("VACUUM ANALYZE"))
    params = {
        "buckets": ALL_BUCKETS_LITERAL,
        "limit": 100,
        "claimed_by": "bench",
        "claim_lease": 60.0,
        "in_flight": "[]",
        "default_max_in_flight": 1000,
        "full_tenants": [],
        "after_bucket": NO_BUCKET,
        "after": LEAST_ID,
        "fences": None,
        "shards": 1,
    }
    timings = []
    with engine.connect() as conn:
        for _ in range(runs):
            began = time.perf_counter()
            conn.execute(queries.CLAIM_BATCH, params).all()
            timings.append((time.perf_counter() - began) * 1000)
            conn.rollback()
    engine.dispose()
    return statistics.median(timings[5:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--connections", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure (median)")
    parser.add_argument("--skip-plan", action="store_true", help="skip the history timing")
    args = parser.parse_args()
    with server_url() as admin:
        url = fresh_database(admin, "poller_bench")
        print(f"claim+complete, batch {args.batch}, {args.rows:,} due rows per run")
        print(f"{'connections':>11} {'raw psycopg':>14} {'poller.rows.claims':>14} {'ratio':>6}")
        for n in args.connections:
            # Interleaved runs, median of each: the machine is shared and noisy.
            runs = {"raw": [], "poller": []}
            for _ in range(args.repeat):
                for mode, figures in runs.items():
                    figures.append(measure(mode, url, args.rows, args.batch, n))
            raw, ours = (statistics.median(runs[m]) for m in ("raw", "poller"))
            print(f"{n:>11} {raw:>10,.0f} r/s {ours:>10,.0f} r/s {ours / raw:>6.2f}")
        if not args.skip_plan:
            empty = claim_median_ms(url, history=0)
            full = claim_median_ms(url, history=1_000_000)
            print(
                f"claim statement median: {empty:.2f} ms with no history, {full:.2f} ms with "
                f"1,000,000 delivered rows ({full / empty:.2f}x)"
            )


if __name__ == "__main__":
    main()
