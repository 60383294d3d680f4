"""``poller demo``: the whole flow on throwaway embedded servers, then clean up.

This first version migrates, creates two endpoints and enqueues messages from
inside SQLAlchemy transactions (some rolled back, to show they never appear);
delivery joins it when the poller service exists.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from poller import Message, enqueue, enqueue_many, migrate
from poller.db import sync_engine
from poller.embedded import EmbeddedPostgres, EmbeddedRedis
from poller.endpoints import create_endpoint
from poller.schema import outbox


@click.command()
@click.option("--messages", default=2000, show_default=True, help="How many messages to enqueue.")
def demo(messages: int) -> None:
    """Run the demo on embedded PostgreSQL + Redis in a temporary folder."""
    console = Console()
    with tempfile.TemporaryDirectory(prefix="poller-demo-") as tmp:
        pg, redis = EmbeddedPostgres(Path(tmp), durable=False), EmbeddedRedis(Path(tmp))
        try:
            started = time.monotonic()
            url = pg.start()
            redis_url = redis.start()
            console.print(f"[bold]PostgreSQL[/] {url}   [bold]Redis[/] {redis_url}")
            migrate.upgrade(url)
            console.print(f"schema at revision {migrate.current_revision(url)}")
            _run_demo(console, url, messages)
            console.print(f"done in {time.monotonic() - started:.1f}s")
        finally:
            redis.stop()
            pg.stop()


def _run_demo(console: Console, url: str, count: int) -> None:
    engine = sync_engine(url)
    try:
        with engine.begin() as conn:
            create_endpoint(conn, "orders", "http://127.0.0.1:9/hooks", allow_private=True)
            create_endpoint(
                conn, "flaky", "http://127.0.0.1:9/fail", max_attempts=3, allow_private=True
            )
        with Session(engine) as session, session.begin():
            enqueue(
                session,
                endpoint="orders",
                event_type="order.created",
                payload={"order": 0},
                idempotency_key="order:0",
            )
        with Session(engine) as session:  # rolled back: this message never exists
            enqueue(
                session,
                endpoint="orders",
                event_type="order.created",
                payload={"order": -1},
                idempotency_key="order:rolled-back",
            )
            session.rollback()
        batch = [
            Message("orders" if i % 10 else "flaky", "order.created", {"order": i}, f"order:{i}")
            for i in range(1, count)
        ]
        started = time.monotonic()
        for start in range(0, len(batch), 500):
            with Session(engine) as session, session.begin():
                enqueue_many(session, batch[start : start + 500])
        elapsed = time.monotonic() - started
        console.print(
            f"enqueued {len(batch)} messages in {elapsed:.2f}s "
            f"({len(batch) / max(elapsed, 1e-9):,.0f}/s)"
        )
        _show_counts(console, engine)
    finally:
        engine.dispose()


def _show_counts(console: Console, engine: object) -> None:
    from sqlalchemy import Engine

    assert isinstance(engine, Engine)
    with engine.connect() as conn:
        rows = conn.execute(select(outbox.c.status, func.count()).group_by(outbox.c.status)).all()
    table = Table(title="outbox")
    table.add_column("status")
    table.add_column("messages", justify="right")
    for status, n in rows:
        table.add_row(status, str(n))
    console.print(table)
