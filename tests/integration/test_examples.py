"""The receiver example in examples/ works against what the poller really sends."""

from __future__ import annotations

import importlib.util
import json
import re
import sqlite3
import uuid
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType

import pytest
from sqlalchemy import Engine, text

from poller.deliver.delivery import webhook_headers
from poller.endpoints.registry import Endpoint
from tests.conftest import make_endpoint, repo_root

SECRET = "whsec_" + "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3"


def _example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, repo_root() / "examples" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _endpoint() -> Endpoint:
    now = datetime.now(UTC)
    return Endpoint(
        1, "shop", "http://x/webhooks", None, True, None, None, None, None, 0, now, now, SECRET
    )


def test_the_flask_receiver_verifies_applies_once_and_answers_lookups() -> None:
    client = _example("flask_receiver").app.test_client()
    body = b'{"order":7}'
    headers = webhook_headers(_endpoint(), "order:7", body, "webhook-poller/test")
    assert client.get("/webhooks/order:7").status_code == 404
    assert client.post("/webhooks", data=body, headers=headers).status_code == 204
    assert client.post("/webhooks", data=body, headers=headers).status_code == 204  # again: no-op
    assert client.get("/webhooks/order:7").status_code == 200
    forged = {**headers, "webhook-signature": "v1,AAAA"}
    assert client.post("/webhooks", data=body, headers=forged).status_code == 401


def test_the_first_webhook_tutorial_runs_as_written(
    db_url: str, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/tutorials/first-webhook.md includes examples/first_webhook.py: run it, with the
    URL as `poller embedded start` prints it, twice."""
    make_endpoint(engine, "shop")
    monkeypatch.setenv("POLLER_DATABASE_URL", db_url)  # postgresql://…, as printed
    example = _example("first_webhook")
    example.main()
    example.main()  # the same invoice: the same message, nothing new
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT endpoint_id, event_type, idempotency_key FROM poller_outbox")
        ).all()
        paid = conn.execute(text("SELECT id, paid FROM invoices")).all()
    assert [(r.event_type, r.idempotency_key) for r in rows] == [
        ("invoice.paid", "invoice:42:paid")
    ]
    assert paid == [(42, True)]


def test_the_traced_example_keeps_one_trace_from_the_shop_to_the_receiver(
    engine: Engine, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shop's request span is stored with its webhook; the example's receiver, given
    what a delivery of that row carries (tests/acceptance/test_tracing_export.py shows a
    real poller sends it), handles it in that trace."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    from poller.rules.tracing import propagated

    example = _example("traced_flask")
    provider = TracerProvider()
    monkeypatch.setattr(example, "tracer", provider.get_tracer("shop"))
    monkeypatch.setenv("POLLER_DATABASE_URL", db_url)
    make_endpoint(engine, "shop", url="http://127.0.0.1:9/webhooks")
    with trace.use_span(provider.get_tracer("t").start_span("outer")) as outer:
        assert example.shop.test_client().post("/orders/7/pay").status_code == 200
    example.engine().dispose()
    with engine.connect() as conn:
        key, payload, parent, state = conn.execute(
            text("SELECT idempotency_key, payload, traceparent, tracestate FROM poller_outbox")
        ).one()
    trace_id = outer.get_span_context().trace_id
    assert parent is not None and parent[3:35] == f"{trace_id:032x}"
    body = json.dumps(payload).encode()
    headers = {**webhook_headers(_endpoint(), key, body, "t"), **propagated(parent, state)}
    sent = example.receiver.test_client().post("/webhooks", data=body, headers=headers)
    assert sent.status_code == 204
    handled_trace, handled_parent = example.handled[0]
    assert handled_trace == trace_id and f"{handled_parent:016x}" == parent[36:52]


def test_the_flask_page_frames_a_link_that_opens_its_tenants_portal(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.integration.test_dashboard import client

    key = "example-portal-key-0123456789abcdefg"
    monkeypatch.setenv("POLLER_PORTAL_KEY", key)
    monkeypatch.setenv("POLLER_PORTAL_URL", "http://127.0.0.1:8188")
    page = _example("portal_flask").app.test_client().get("/settings/webhooks")
    assert page.status_code == 200
    link = re.search(r'<iframe src="([^"]+)"', page.text).group(1)  # type: ignore[union-attr]
    with client(engine, portal_key=key, portal_embed_origins=("http://127.0.0.1:5000",)) as web:
        opened = web.get(link.replace("&amp;", "&").removeprefix("http://127.0.0.1:8188"))
        assert opened.status_code == 303
        assert "frame-ancestors http://127.0.0.1:5000" in opened.headers["content-security-policy"]
        assert "partitioned" in opened.headers["set-cookie"].lower()  # kept inside the frame


async def test_the_rabbitmq_consumer_verifies_applies_once_and_rejects_a_forgery(
    amqp_url: str, tmp_path: Path
) -> None:
    """What the poller publishes, twice as after an unknown outcome, and a forgery: the
    consumer applies the first, acknowledges the copy without applying it, rejects the
    forgery — and leaves nothing in the queue."""
    import aio_pika
    from standardwebhooks import Webhook

    from poller.deliver.amqp_sender import AmqpSender

    consumer = _example("rabbitmq_consumer")
    name = f"orders{uuid.uuid4().hex[:8]}"
    connection = await aio_pika.connect(amqp_url)
    sender = AmqpSender(allow_private=True)
    try:
        queue = await (await connection.channel()).declare_queue(name, durable=True)
        body = json.dumps({"order": 7, "status": "paid"}).encode()
        headers = webhook_headers(_endpoint(), "order:7:paid", body, "t", http=False)
        for _ in range(2):
            await sender.request("POST", f"{amqp_url}?routing_key={name}", headers, body, 5)
        forged = {**headers, "webhook-id": "order:7:refunded", "webhook-signature": "v1,AAAA"}
        await sender.request("POST", f"{amqp_url}?routing_key={name}", forged,
                             b'{"order": 7, "status": "refunded"}', 5)  # fmt: skip
        db = sqlite3.connect(tmp_path / "orders.db")
        db.executescript(consumer.SCHEMA)
        said = [
            await consumer.handle(await queue.get(timeout=5), Webhook(SECRET), db) for _ in range(3)
        ]
        assert said == ["applied", "duplicate", "rejected"]
        assert db.execute("SELECT id, status FROM orders").fetchall() == [(7, "paid")]
        assert await queue.get(fail=False) is None
    finally:
        await sender.aclose()
        await connection.close()
