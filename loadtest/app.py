"""The load test's application: an order service with a transactional outbox.

``POST /orders`` ({"customer": "...", "amount_cents": 1234}) inserts an order
and enqueues its ``order.created`` webhook **in one SQLAlchemy transaction**,
the way a real application uses webhook-poller; it answers 201 with the order
id and idempotency key once the transaction has committed. ``GET /healthz``.

A bare ASGI app (no framework) so the figures measure the outbox, not a web
framework: run it with ``uvicorn loadtest.app:app``. It reads
``POLLER_DATABASE_URL`` and creates its ``loadtest_orders`` table on start.
"""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from poller import enqueue_async
from poller.store.db import async_engine

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

ORDERS_TABLE = """
CREATE TABLE IF NOT EXISTS loadtest_orders (
    id bigserial PRIMARY KEY,
    customer text NOT NULL,
    amount_cents integer NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
)
"""
ENDPOINT = os.environ.get("LOADTEST_ENDPOINT", "orders")
_engine: AsyncEngine | None = None


async def _respond(send: Send, status: int, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(data)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": data})


async def _read(receive: Receive) -> bytes:
    body, more = b"", True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    return body


async def create_order(engine: AsyncEngine, order: dict[str, Any]) -> dict[str, Any]:
    """The order row and its webhook, committed together (or not at all)."""
    async with AsyncSession(engine) as session, session.begin():
        order_id = (
            await session.execute(
                text(
                    "INSERT INTO loadtest_orders (customer, amount_cents) "
                    "VALUES (:customer, :amount) RETURNING id"
                ),
                {"customer": str(order["customer"]), "amount": int(order["amount_cents"])},
            )
        ).scalar_one()
        key = f"order:{order_id}"
        await enqueue_async(
            session,
            endpoint=ENDPOINT,
            event_type="order.created",
            payload={
                "order_id": order_id,
                "customer": order["customer"],
                "amount_cents": order["amount_cents"],
            },
            idempotency_key=key,
        )
    return {"order_id": order_id, "key": key}


async def _lifespan(receive: Receive, send: Send) -> None:
    global _engine
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            _engine = async_engine(os.environ["POLLER_DATABASE_URL"], pool_size=20, max_overflow=20)
            async with _engine.begin() as conn:
                await conn.execute(text(ORDERS_TABLE))
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            if _engine is not None:
                await _engine.dispose()
            await send({"type": "lifespan.shutdown.complete"})
            return


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] == "lifespan":
        await _lifespan(receive, send)
        return
    method, path = scope["method"], scope["path"]
    if method == "GET" and path == "/healthz":
        await _respond(send, 200, {"status": "ok"})
    elif method == "POST" and path == "/orders":
        assert _engine is not None
        try:
            order = json.loads(await _read(receive))
            result = await create_order(_engine, order)
        except (ValueError, KeyError, TypeError) as exc:
            await _respond(send, 400, {"error": str(exc)})
            return
        await _respond(send, 201, result)
    else:
        await _respond(send, 404, {"error": "not found"})
