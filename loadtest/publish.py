"""What publishing costs the application, beside plain enqueue in the same run.

    python -m loadtest.publish [--events 2000] [--rounds 3]

* **Latency at the app**: one transaction per event (begin, call, commit), as an
  application does: ``enqueue`` to one endpoint against ``publish`` to 1, 10
  and 100 subscribers. Median and p99 in ms, events/s and rows/s of one
  connection. Target: publish to 10 subscribers ≤ 2× one enqueue.
* **Batches**: ``enqueue_many`` of 100 messages against ``publish_many`` of 100
  events to 10 subscribers each, per transaction.
* **Large fan-out**: one event of 4 KiB to 1,000 endpoints, the layout we chose
  (the payload kept once in ``poller_events``, rows referencing it) against
  copying the payload into every row (one statement of the same shape each):
  ms per event and WAL bytes written.

Rounds are interleaved; figures are medians over rounds. Before each
measurement the tables are emptied and given --history delivered rows (200,000),
so every variant starts from the same state, that of a table in use.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine, text

from loadtest.bench_db import fresh_database, server_url
from loadtest.fixtures import insert_history
from poller import Event, Message, enqueue, enqueue_many, publish, publish_many
from poller.store.db import sync_engine

PAYLOAD = {"order": 1, "customer": "c-42", "total": "19.99", "lines": [{"sku": "a", "n": 2}]}
# Random text (base64 of random bytes): a payload TOAST compression cannot shrink much.
BLOB = {"blob": base64.b64encode(os.urandom(3072)).decode()}

# The large fan-out's two layouts, each one statement of the same shape (the event,
# then a row per subscriber): rows referencing their event's payload (what
# poller_publish writes), against the payload copied into every row (rejected).
LAYOUT = """
    WITH ev AS (
        INSERT INTO poller_events (event_type, payload, idempotency_key, fanned_out)
        VALUES ('wide.x', CAST(:payload AS json), :idempotency_key, 1000) RETURNING id
    )
    INSERT INTO poller_outbox (endpoint_id, bucket, event_type, idempotency_key,
                               max_attempts, event_id{column})
    SELECT e.id, e.bucket, 'wide.x', :idempotency_key, 10, ev.id{value}
    FROM ev CROSS JOIN poller_endpoints e WHERE e.event_types = ARRAY['wide.*']
"""
REFERENCE = LAYOUT.format(column="", value="")
COPYING = LAYOUT.format(column=", payload", value=", CAST(:payload AS json)")


def _setup(engine: Engine) -> None:
    """Endpoint e1 takes t1, t10, t100; e2–e10 take t10, t100; e11–e100 take t100; and a
    thousand more (f1…f1000) take wide.*."""
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO poller_endpoints (name, url, secret, bucket, event_types) "
                "SELECT 'e' || i, 'http://127.0.0.1:9/' || i, 'whsec_x', i % 256, "
                "CASE WHEN i = 1 THEN ARRAY['t1', 't10', 't100'] "
                "     WHEN i <= 10 THEN ARRAY['t10', 't100'] ELSE ARRAY['t100'] END "
                "FROM generate_series(1, 100) AS i"
            )
        )
        conn.execute(
            text(
                "INSERT INTO poller_endpoints (name, url, secret, bucket, event_types) "
                "SELECT 'f' || i, 'http://127.0.0.1:9/f' || i, 'whsec_x', i % 256, "
                "ARRAY['wide.*'] FROM generate_series(1, 1000) AS i"
            )
        )


def _empty(engine: Engine, history: int) -> None:
    """Empty tables, then ``history`` delivered rows and a tenth as many past events, as
    tables in production have: so neither variant's own rows decide how big the indexes
    are or when autovacuum runs, and the planner's statistics are those of tables in use
    (analysed empty, ``poller_events`` would be scanned by every foreign key check)."""
    with engine.begin() as conn:
        conn.execute(text("TRUNCATE poller_outbox, poller_events, poller_delivery_attempts"))
        endpoint = conn.execute(
            text("SELECT id, bucket FROM poller_endpoints WHERE name = 'e1'")
        ).one()
        insert_history(conn, endpoint.id, endpoint.bucket, history)
        conn.execute(  # and past events: a table PostgreSQL has statistics for, not an empty one
            text(
                "INSERT INTO poller_events (event_type, payload, idempotency_key) "
                "SELECT 'past', '{}', 'past:' || g FROM generate_series(1, :n) AS g"
            ),
            {"n": history // 10},
        )
    with engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").execute(text("VACUUM ANALYZE"))


def _timed(engine: Engine, n: int, call: Callable[[Any, int], Any]) -> list[float]:
    """Milliseconds of each of ``n`` transactions that run ``call(conn, i)``."""
    took = []
    with engine.connect() as conn:
        for i in range(n):
            started = time.perf_counter()
            with conn.begin():
                call(conn, i)
            took.append((time.perf_counter() - started) * 1000)
    return took


def _single(kind: str) -> Callable[[Any, int], Any]:
    if kind == "enqueue":
        return lambda conn, i: enqueue(
            conn, endpoint="e1", event_type="t1", payload=PAYLOAD, idempotency_key=f"q{i}"
        )
    return lambda conn, i: publish(
        conn, event_type=kind, payload=PAYLOAD, idempotency_key=f"{kind}-{i}"
    )


def _batch(kind: str) -> Callable[[Any, int], Any]:
    if kind == "enqueue_many":
        return lambda conn, i: enqueue_many(
            conn, [Message("e1", "t1", PAYLOAD, f"q{i}-{j}") for j in range(100)]
        )
    return lambda conn, i: publish_many(
        conn, [Event("t10", PAYLOAD, f"m{i}-{j}") for j in range(100)]
    )


def _wal(engine: Engine, run: Callable[[], None]) -> int:
    with engine.connect() as conn:
        before = conn.execute(text("SELECT pg_current_wal_lsn()")).scalar_one()
        run()
        return int(
            conn.execute(
                text("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), CAST(:b AS pg_lsn))"),
                {"b": before},
            ).scalar_one()
        )


def _wide(engine: Engine, sql: str, n: int) -> tuple[float, float]:
    """ms per 1,000-endpoint event, WAL bytes per event."""
    took: list[float] = []

    def run() -> None:
        with engine.connect() as conn:
            for i in range(n):
                params = {"payload": json.dumps(BLOB), "idempotency_key": f"w{i}"}
                started = time.perf_counter()
                with conn.begin():
                    conn.execute(text(sql), params)
                took.append((time.perf_counter() - started) * 1000)

    wal = _wal(engine, run)
    return statistics.median(took), wal / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=2000, help="transactions per variant")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--wide", type=int, default=20, help="1,000-endpoint events per round")
    parser.add_argument("--history", type=int, default=200_000, help="delivered rows first")
    args = parser.parse_args()
    singles = ["enqueue", "t1", "t10", "t100"]
    batches = ["enqueue_many", "publish_many"]
    lat: dict[str, list[float]] = {k: [] for k in singles + batches}
    p99: dict[str, list[float]] = {k: [] for k in singles + batches}
    wide: dict[str, list[tuple[float, float]]] = {"reference": [], "copy": []}
    with server_url() as admin:
        url = fresh_database(admin, "poller_bench_publish")
        engine = sync_engine(url)
        _setup(engine)
        for _ in range(args.rounds):
            for kind in singles:
                _empty(engine, args.history)
                took = _timed(engine, args.events, _single(kind))
                lat[kind].append(statistics.median(took))
                p99[kind].append(statistics.quantiles(took, n=100)[98])
            for kind in batches:
                _empty(engine, args.history)
                took = _timed(engine, max(args.events // 100, 5), _batch(kind))
                lat[kind].append(statistics.median(took))
                p99[kind].append(statistics.quantiles(took, n=100)[98])
            for layout, sql in (("reference", REFERENCE), ("copy", COPYING)):
                _empty(engine, args.history)
                wide[layout].append(_wide(engine, sql, args.wide))
        engine.dispose()
    fan = {"enqueue": 1, "t1": 1, "t10": 10, "t100": 100, "enqueue_many": 100, "publish_many": 1000}
    events = {"enqueue_many": 100, "publish_many": 100}
    base = statistics.median(lat["enqueue"])
    header = f"{'ms median':>10}{'ms p99':>9}{'events/s':>10}{'rows/s':>10}{'× enqueue':>11}"
    print(f"\n{'variant':<34}{header}")
    names = {
        "enqueue": "enqueue (1 endpoint)",
        "t1": "publish to 1 subscriber",
        "t10": "publish to 10 subscribers",
        "t100": "publish to 100 subscribers",
        "enqueue_many": "enqueue_many (100 messages)",
        "publish_many": "publish_many (100 events × 10)",
    }
    for kind in singles + batches:
        ms = statistics.median(lat[kind])
        per_tx = events.get(kind, 1)
        rate = per_tx * 1000 / ms
        ratio = f"{ms / base:.2f}" if kind in singles else ""
        print(
            f"{names[kind]:<34}{ms:>10.2f}{statistics.median(p99[kind]):>9.2f}"
            f"{rate:>10.0f}{rate * fan[kind] / per_tx:>10.0f}{ratio:>11}"
        )
    print("\n1 event of 4 KiB to 1,000 endpoints:")
    for layout, label in (
        ("reference", "payload once, rows reference it"),
        ("copy", "payload copied into every row"),
    ):
        ms = statistics.median(m for m, _ in wide[layout])
        wal = statistics.median(w for _, w in wide[layout])
        print(f"  {label:<34}{ms:>8.1f} ms/event{wal / 1024:>10.0f} KiB WAL/event")


if __name__ == "__main__":
    main()
