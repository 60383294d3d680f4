"""A JetStream consumer of webhook-poller's messages in nats-py: verify, apply once, ack.

    pip install nats-py standardwebhooks
    WEBHOOK_SECRET=whsec_... python examples/nats_consumer.py nats://localhost:4222 \\
        orders.events orders-consumer

The endpoint publishes to the subject (``nats://…/orders.events``), which a stream
takes. JetStream drops the poller's resend of a message within the stream's duplicate
window (``Nats-Msg-Id`` = ``webhook-id``); a consumer still sees a message again when
it did not acknowledge it within ``ack_wait`` (it died, or took too long), and a
resend past the window is stored again. So the event is applied once per id
(examples/ledger.py) and acknowledged after the commit. A message whose signature does
not verify is terminated: never redelivered.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import sys

import nats
from ledger import apply_once, open_ledger
from nats.aio.msg import Msg
from standardwebhooks import Webhook, WebhookVerificationError


async def handle(msg: Msg, webhook: Webhook, db: sqlite3.Connection) -> str:
    """Verify, apply once and acknowledge one message; what became of it."""
    headers = dict(msg.headers or {})
    try:  # the signature, and a timestamp within five minutes (an old copy replayed fails)
        event = webhook.verify(msg.data, headers)
    except WebhookVerificationError:
        await msg.term()
        return "rejected"
    applied = apply_once(db, headers["webhook-id"], event)
    await msg.ack()  # after the commit
    return "applied" if applied else "duplicate"


async def consume(
    url: str, subject: str, durable: str, webhook: Webhook, db: sqlite3.Connection
) -> None:
    client = await nats.connect(url)
    try:
        subscription = await client.jetstream().pull_subscribe(subject, durable)
        while True:
            try:
                messages = await subscription.fetch(64, timeout=5)
            except nats.errors.TimeoutError:
                continue
            for msg in messages:
                print(msg.headers and msg.headers.get("webhook-id"),
                      await handle(msg, webhook, db), flush=True)  # fmt: skip
    finally:
        await client.close()


if __name__ == "__main__":
    url, subject, durable = sys.argv[1], sys.argv[2], sys.argv[3]
    webhook = Webhook(os.environ["WEBHOOK_SECRET"])
    asyncio.run(consume(url, subject, durable, webhook, open_ledger("orders.db")))
