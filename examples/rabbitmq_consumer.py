"""A RabbitMQ consumer of webhook-poller's messages in aio-pika: verify, apply once, ack.

    pip install aio-pika standardwebhooks
    WEBHOOK_SECRET=whsec_... python examples/rabbitmq_consumer.py amqp://localhost/ orders

The endpoint publishes to the queue (``amqp://…/?routing_key=orders``). RabbitMQ may
hold a message twice — the poller sends it again after an *unknown* outcome, a confirm
that never came — and both copies carry the same ``webhook-id`` (also the message's
``message_id``); a consumer that dies before acknowledging gets it again too. So the
event is applied once per id (examples/ledger.py) and acknowledged after the commit. A
message whose signature does not verify is rejected without requeueing (to a
dead-letter exchange if the queue has one).
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import sys

import aio_pika
from ledger import apply_once, open_ledger
from standardwebhooks import Webhook, WebhookVerificationError


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
    webhook = Webhook(os.environ["WEBHOOK_SECRET"])
    asyncio.run(consume(url, queue_name, webhook, open_ledger("orders.db")))
