"""A Redis stream consumer of webhook-poller's messages in redis-py: verify, apply once,
acknowledge, in a consumer group.

    pip install redis standardwebhooks
    WEBHOOK_SECRET=whsec_... python examples/redis_consumer.py redis://localhost:6379/0 \\
        orders billing worker-1

The endpoint adds entries to the stream (``redis://…/0?stream=orders``); the poller's
script adds a resend of an id the stream has as nothing. A consumer still sees an entry
again when it died between reading and acknowledging it: at its start it reads its own
pending entries (id ``0``) before new ones (``>``). So the event is applied once per
id (examples/ledger.py) and acknowledged (``XACK``) after the commit. An entry whose
signature does not verify is acknowledged unapplied (copy it to a stream of your own
first if you want to look at it).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import sys
from typing import Any

import redis.asyncio
from ledger import apply_once, open_ledger
from standardwebhooks import Webhook, WebhookVerificationError


async def handle(
    client: redis.asyncio.Redis,
    stream: str,
    group: str,
    entry: tuple[bytes, dict[bytes, bytes]],
    webhook: Webhook,
    db: sqlite3.Connection,
) -> str:
    """Verify, apply once and acknowledge one entry; what became of it."""
    entry_id, raw = entry
    fields = {name.decode(): value for name, value in raw.items()}
    body = fields.pop("body")
    headers = {name: value.decode() for name, value in fields.items()}
    try:  # the signature, and a timestamp within five minutes (an old copy replayed fails)
        event = webhook.verify(body, headers)
    except WebhookVerificationError:
        await client.xack(stream, group, entry_id)
        return "rejected"
    applied = apply_once(db, headers["webhook-id"], event)
    await client.xack(stream, group, entry_id)  # after the commit
    return "applied" if applied else "duplicate"


async def consume(
    url: str, stream: str, group: str, name: str, webhook: Webhook, db: sqlite3.Connection
) -> None:
    client: Any = redis.asyncio.Redis.from_url(url)
    with contextlib.suppress(redis.ResponseError):  # BUSYGROUP: it exists
        await client.xgroup_create(stream, group, id="0", mkstream=True)
    start = "0"  # first what this consumer read and never acknowledged, then new entries
    while True:
        got = await client.xreadgroup(group, name, {stream: start}, count=64, block=5000)
        entries = got[0][1] if got else []
        if start == "0" and not entries:
            start = ">"
        for entry in entries:
            print(entry[0], await handle(client, stream, group, entry, webhook, db), flush=True)


if __name__ == "__main__":
    url, stream, group, name = sys.argv[1:5]
    webhook = Webhook(os.environ["WEBHOOK_SECRET"])
    asyncio.run(consume(url, stream, group, name, webhook, open_ledger("orders.db")))
