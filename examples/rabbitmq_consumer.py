"""A RabbitMQ consumer of webhook-poller's messages in aio-pika: verify, apply once, ack.

    pip install aio-pika standardwebhooks
    WEBHOOK_SECRET=whsec_... python examples/rabbitmq_consumer.py amqp://localhost/ orders

The endpoint publishes to the queue (``amqp://…/?routing_key=orders``). RabbitMQ may
hold a message twice — the poller sends it again after an *unknown* outcome, a confirm
that never came — and both copies carry the same ``webhook-id`` (also the message's
``message_id``). So the consumer applies the event and records its id in one
transaction, skips an id it has recorded, and acknowledges only after the commit: a
crash between the two redelivers the message, and the record makes that a no-op. A
message whose signature does not verify is rejected without requeueing (to a
dead-letter exchange if the queue has one). SQLite stands in for your database.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import sys
from typing import Any

import aio_pika
from standardwebhooks import Webhook, WebhookVerificationError

SCHEMA = """
CREATE TABLE IF NOT EXISTS processed (webhook_id TEXT PRIMARY KEY);
CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, status TEXT NOT NULL);
"""


def apply_once(db: sqlite3.Connection, webhook_id: str, event: dict[str, Any]) -> bool:
    """Apply ``event`` unless ``webhook_id`` was applied before; whether it was applied now."""
    with db:  # one transaction: the effect and the record of its id
        added = db.execute(
            "INSERT INTO processed (webhook_id) VALUES (?) ON CONFLICT DO NOTHING", (webhook_id,)
        )
        if added.rowcount == 0:
            return False  # a copy of one already applied
        db.execute(
            "INSERT INTO orders (id, status) VALUES (?, ?) "
            "ON CONFLICT (id) DO UPDATE SET status = excluded.status",
            (event["order"], event["status"]),
        )
        return True


async def handle(
    message: aio_pika.abc.AbstractIncomingMessage, webhook: Webhook, db: sqlite3.Connection
) -> str:
    """Verify, apply once and acknowledge one message; what became of it."""
    headers = {name: str(value) for name, value in message.headers.items()}
    try:  # the signature, and a timestamp within five minutes (an old copy replayed fails)
        event = webhook.verify(message.body, headers)
    except WebhookVerificationError:
        await message.reject(requeue=False)
        return "rejected"
    applied = apply_once(db, headers["webhook-id"], event)
    await message.ack()  # after the commit
    return "applied" if applied else "duplicate"


async def consume(url: str, queue_name: str, webhook: Webhook, db: sqlite3.Connection) -> None:
    db.executescript(SCHEMA)
    connection = await aio_pika.connect_robust(url)
    async with connection:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=64)
        queue = await channel.declare_queue(queue_name, durable=True)
        async with queue.iterator() as messages:
            async for message in messages:
                print(message.message_id, await handle(message, webhook, db), flush=True)


if __name__ == "__main__":
    url, queue_name = sys.argv[1], sys.argv[2]
    asyncio.run(
        consume(
            url, queue_name, Webhook(os.environ["WEBHOOK_SECRET"]), sqlite3.connect("orders.db")
        )
    )
