"""The triggers recipe (examples/orders_trigger.sql, docs/how-to/triggers.md): table
changes become webhooks in the transaction that made them."""

from __future__ import annotations

import json

import psycopg
from sqlalchemy import Engine

from poller.store.db import libpq_url
from tests.conftest import make_endpoint, repo_root
from tests.integration.helpers import wait_for
from tests.integration.service_helpers import fast_settings, running_poller, running_receiver

RECIPE = repo_root() / "examples" / "orders_trigger.sql"


async def test_changes_to_orders_are_published_with_their_transaction(
    engine: Engine, db_url: str
) -> None:
    async with running_receiver() as (receiver, url):
        make_endpoint(engine, "shop", url=url, event_types=["order.*"])
        with psycopg.connect(libpq_url(db_url)) as conn:
            conn.execute(RECIPE.read_text())
            conn.commit()
            order = conn.execute(
                "INSERT INTO orders (customer, total) VALUES ('acme', 42.50) RETURNING id"
            ).fetchone()[0]
            conn.execute("UPDATE orders SET status = 'paid' WHERE id = %s", [order])
            conn.execute("UPDATE orders SET status = 'paid' WHERE id = %s", [order])  # no change
            conn.commit()
            conn.execute("INSERT INTO orders (customer, total) VALUES ('globex', 1)")
            conn.execute("UPDATE orders SET status = 'void' WHERE id = %s", [order])
            conn.rollback()
            events = conn.execute(
                "SELECT event_type, payload::text FROM poller_events ORDER BY id"
            ).fetchall()
        assert [e[0] for e in events] == ["order.created", "order.updated"]
        async with running_poller(db_url, fast_settings()):
            await wait_for(lambda: receiver.stats.applied == 2, timeout=20)
    assert (receiver.stats.ordered, receiver.stats.order_violations) == (2, 0)
    assert [json.loads(e[1]) for e in events] == [
        {"id": order, "customer": "acme", "total": 42.50, "status": "open"},
        {"id": order, "customer": "acme", "total": 42.50, "status": "paid"},
    ]
