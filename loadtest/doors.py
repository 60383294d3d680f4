"""What each door into the outbox costs the application, against a plain INSERT.

    python -m loadtest.doors [--messages 2000] [--batch 1000] [--rounds 3]

* **One message per transaction** (begin, call, commit) on one connection, as a
  request handler does, through every door: messages/s, and messages per second of
  the application's CPU (this process's CPU time: the database's work is not the
  application's). The baseline is a plain ``INSERT`` of a row as wide as the outbox's
  into a table with the same columns and its unique key (psycopg, one transaction
  each) — the floor of any transactional write.
* **Batches**: ``--batch`` messages in one transaction through ``enqueue_many``
  (psycopg), ``poller_enqueue_many`` in SQL, against a multi-row ``INSERT`` of the
  same rows (``unnest`` of arrays).

Targets (issue 58): the SQL function ≥ 0.8× the Python door on the same driver; every
door ≥ 0.5× the plain ``INSERT``. Rounds are interleaved; figures are medians. Tables
are emptied before each measurement.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import psycopg

import poller
from loadtest.bench_db import fresh_database, server_url
from poller import Message
from poller.store.db import libpq_url, sync_engine

PAYLOAD = {"order": 1, "customer": "c-42", "total": "19.99", "lines": [{"sku": "a", "n": 2}]}
PLAIN = """
CREATE TABLE IF NOT EXISTS bench_plain (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, endpoint_id bigint NOT NULL,
    bucket smallint NOT NULL, event_type text NOT NULL, payload json,
    idempotency_key text NOT NULL, status text NOT NULL DEFAULT 'pending',
    attempts integer NOT NULL DEFAULT 0, max_attempts integer NOT NULL,
    next_attempt_at timestamptz NOT NULL DEFAULT now(), ordering_key text,
    created_at timestamptz NOT NULL DEFAULT now(), updated_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (endpoint_id, idempotency_key))
"""
INSERT = (
    "INSERT INTO bench_plain (endpoint_id, bucket, event_type, payload, idempotency_key, "
    "max_attempts) VALUES (%s, %s, %s, %s, %s, %s) RETURNING id"
)
INSERT_MANY = (
    "INSERT INTO bench_plain (endpoint_id, bucket, event_type, payload, idempotency_key, "
    "max_attempts) SELECT 1, 7, 'order.paid', p, k, 10 "
    "FROM unnest(CAST(%s AS json[]), CAST(%s AS text[])) AS r(p, k)"
)
SQL_ENQUEUE = (
    "SELECT poller_enqueue(endpoint => %s, event_type => %s, payload => %s, idempotency_key => %s)"
)
SQL_ENQUEUE_MANY = (
    "SELECT poller_enqueue_many(endpoints => %s, event_types => %s, payloads => %s, "
    "idempotency_keys => %s)"
)
FIELDS = {"endpoint": "billing", "event_type": "order.paid", "payload": PAYLOAD}


def _key(run: str, i: int) -> str:
    return f"{run}:{i}"


def _sync(url: str, name: str, n: int, run: str) -> None:
    """``n`` transactions of one message each through a synchronous door."""
    text = json.dumps(PAYLOAD)
    if name in ("insert", "sql", "psycopg"):
        with psycopg.connect(url) as conn:
            for i in range(n):
                with conn.transaction():
                    if name == "insert":
                        conn.execute(INSERT, (1, 7, "order.paid", text, _key(run, i), 10))
                    elif name == "sql":
                        conn.execute(SQL_ENQUEUE, ("billing", "order.paid", text, _key(run, i)))
                    else:
                        poller.enqueue(conn, **FIELDS, idempotency_key=_key(run, i))
        return
    if name == "psycopg2":
        import psycopg2

        conn2 = psycopg2.connect(url)
        try:
            for i in range(n):
                with conn2:
                    poller.enqueue(conn2, **FIELDS, idempotency_key=_key(run, i))
        finally:
            conn2.close()
        return
    if name == "sqlalchemy":
        from sqlalchemy.orm import Session

        engine = sync_engine(url)
        with Session(engine) as session:
            for i in range(n):
                with session.begin():
                    poller.enqueue(session, **FIELDS, idempotency_key=_key(run, i))
        engine.dispose()
        return
    if name == "django":
        from django.db import connection, transaction

        from poller.contrib import django as outbox

        for i in range(n):
            with transaction.atomic():
                outbox.enqueue(**FIELDS, idempotency_key=_key(run, i))
        connection.close()
        return
    raise ValueError(name)


async def _async(url: str, name: str, n: int, run: str) -> None:
    """``n`` transactions of one message each through an asynchronous door."""
    if name == "asyncpg":
        import asyncpg

        conn = await asyncpg.connect(url)
        for i in range(n):
            async with conn.transaction():
                await poller.enqueue_async(conn, **FIELDS, idempotency_key=_key(run, i))
        await conn.close()
    elif name == "psycopg-async":
        async with await psycopg.AsyncConnection.connect(url) as aconn:
            for i in range(n):
                async with aconn.transaction():
                    await poller.enqueue_async(aconn, **FIELDS, idempotency_key=_key(run, i))
    elif name == "sqlalchemy-async":
        from sqlalchemy.ext.asyncio import AsyncSession

        from poller.store.db import async_engine

        engine = async_engine(url)
        async with AsyncSession(engine) as session:
            for i in range(n):
                async with session.begin():
                    await poller.enqueue_async(session, **FIELDS, idempotency_key=_key(run, i))
        await engine.dispose()
    else:
        raise ValueError(name)


def _run_async(url: str, name: str, n: int, run: str) -> None:
    asyncio.run(_async(url, name, n, run))


def _batch(url: str, name: str, size: int, batches: int, run: str) -> None:
    text = json.dumps(PAYLOAD)
    with psycopg.connect(url) as conn:
        for b in range(batches):
            keys = [_key(run, b * size + i) for i in range(size)]
            with conn.transaction():
                if name == "insert":
                    conn.execute(INSERT_MANY, ([text] * size, keys))
                elif name == "sql":
                    names, types = ["billing"] * size, ["order.paid"] * size
                    conn.execute(SQL_ENQUEUE_MANY, (names, types, [text] * size, keys))
                else:
                    poller.enqueue_many(conn, [Message("billing", "order.paid", PAYLOAD, k)
                                               for k in keys])  # fmt: skip


def _measure(url: str, call: Callable[[], Any], messages: int) -> tuple[float, float]:
    """Messages per second, and per second of this process's CPU."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE poller_outbox, poller_events, bench_plain CASCADE")
    wall, cpu = time.perf_counter(), time.process_time()
    call()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return messages / wall, messages / cpu


SINGLE = ("insert", "sql", "psycopg", "psycopg2", "sqlalchemy", "django",
          "asyncpg", "psycopg-async", "sqlalchemy-async")  # fmt: skip
BATCH = ("insert", "sql", "psycopg")
LABELS = {
    "insert": "plain INSERT (psycopg)",
    "sql": "SELECT poller_enqueue(…) (psycopg)",
    "psycopg": "poller.enqueue, psycopg 3",
    "psycopg2": "poller.enqueue, psycopg2",
    "sqlalchemy": "poller.enqueue, SQLAlchemy Session",
    "django": "contrib.django.enqueue, atomic()",
    "asyncpg": "poller.enqueue_async, asyncpg",
    "psycopg-async": "poller.enqueue_async, psycopg async",
    "sqlalchemy-async": "poller.enqueue_async, SQLAlchemy async",
}


def _django(url: str) -> None:
    import django
    from django.conf import settings
    from sqlalchemy.engine import make_url

    u = make_url(url)
    settings.configure(
        USE_TZ=True, INSTALLED_APPS=["poller.contrib.django"],
        DATABASES={"default": {
            "ENGINE": "django.db.backends.postgresql", "NAME": u.database, "HOST": u.host,
            "PORT": str(u.port), "USER": u.username, "PASSWORD": u.password or "",
        }},
    )  # fmt: skip
    django.setup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=2000, help="transactions per door")
    parser.add_argument("--batch", type=int, default=1000, help="messages per batch")
    parser.add_argument("--batches", type=int, default=20, help="batches per variant")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    single: dict[str, list[tuple[float, float]]] = {k: [] for k in SINGLE}
    batch: dict[str, list[tuple[float, float]]] = {k: [] for k in BATCH}
    with server_url() as admin:
        url = fresh_database(admin, "poller_bench_doors")
        libpq = libpq_url(url)
        engine = sync_engine(url)
        with engine.begin() as conn:
            from poller.endpoints.registry import create_endpoint

            create_endpoint(conn, "billing", "https://billing.example.com/hooks")
        engine.dispose()
        with psycopg.connect(libpq, autocommit=True) as conn:
            conn.execute(PLAIN)
        _django(url)
        n = args.messages
        for r in range(args.rounds):
            for name in SINGLE:
                run = f"{name}{r}"
                target = url if name.startswith("sqlalchemy") else libpq
                call: Callable[[], Any] = functools.partial(_sync, target, name, n, run)
                if name in ("asyncpg", "psycopg-async", "sqlalchemy-async"):
                    call = functools.partial(_run_async, target, name, n, run)
                single[name].append(_measure(libpq, call, n))
            for name in BATCH:
                run = f"b{name}{r}"
                call = functools.partial(_batch, libpq, name, args.batch, args.batches, run)
                batch[name].append(_measure(libpq, call, args.batch * args.batches))
    _report("One message per transaction", single, args.messages)
    _report(f"Batches of {args.batch}", batch, args.batch * args.batches)


def _report(title: str, results: dict[str, list[tuple[float, float]]], messages: int) -> None:
    base = statistics.median(rate for rate, _ in results["insert"])
    python = statistics.median(rate for rate, _ in results["psycopg"])
    print(f"\n{title} ({messages} messages a door, medians):")
    print(f"{'door':<40}{'msgs/s':>9}{'msgs/CPU s':>12}{'× INSERT':>10}{'× Python':>10}")
    for name, runs in results.items():
        rate = statistics.median(r for r, _ in runs)
        per_cpu = statistics.median(c for _, c in runs)
        versus = f"{rate / python:.2f}" if name == "sql" else ""
        label = LABELS[name] if title.startswith("One") else _batch_label(name)
        print(f"{label:<40}{rate:>9.0f}{per_cpu:>12.0f}{rate / base:>10.2f}{versus:>10}")


def _batch_label(name: str) -> str:
    return {"insert": "multi-row INSERT (psycopg)", "sql": "SELECT poller_enqueue_many(…)",
            "psycopg": "poller.enqueue_many, psycopg 3"}[name]  # fmt: skip


if __name__ == "__main__":
    main()
