"""The receiver example in examples/ works against what the poller really sends."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from sqlalchemy import Engine, text

from poller.deliver.delivery import webhook_headers
from poller.endpoints.registry import Endpoint
from tests.conftest import make_endpoint, repo_root
from tests.integration.helpers import wait_for

SECRET = "whsec_" + "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3"


def _example(name: str) -> ModuleType:
    folder = str(repo_root() / "examples")
    if folder not in sys.path:  # as running a script in it has it: the consumers' ledger
        sys.path.append(folder)
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
    """What the poller publishes — a message twice as after an unknown outcome, a
    forgery, another message: RabbitMQ queues both copies, the consumer applies the
    first, acknowledges the copy without applying it, rejects the forgery — and leaves
    nothing in the queue."""
    import aio_pika
    from standardwebhooks import Webhook

    from poller.deliver.amqp_sender import AmqpSender

    consumer = _example("rabbitmq_consumer")
    name = f"orders{uuid.uuid4().hex[:8]}"
    connection = await aio_pika.connect(amqp_url)
    sender = AmqpSender(allow_private=True)
    try:
        queue = await (await connection.channel()).declare_queue(name, durable=True)
        await _publish_story(sender, f"{amqp_url}?routing_key={name}")
        db = _example("ledger").open_ledger(str(tmp_path / "orders.db"))
        said = [
            await consumer.handle(await queue.get(timeout=5), Webhook(SECRET), db) for _ in range(4)
        ]
        assert said == ["applied", "duplicate", "rejected", "applied"]  # no dedupe in RabbitMQ
        assert db.execute("SELECT id, status FROM orders").fetchall() == [(7, "shipped")]
        assert await queue.get(fail=False) is None
    finally:
        await sender.aclose()
        await connection.close()


def _signed(webhook_id: str, status: str) -> tuple[dict[str, str], bytes]:
    """What the poller publishes for an order's event to a broker."""
    body = json.dumps({"order": 7, "status": status}).encode()
    return webhook_headers(_endpoint(), webhook_id, body, "t", http=False), body


async def _publish_story(sender: Any, url: str) -> None:
    """Through the poller's own sender: order 7 paid (twice, as a resend after an unknown
    outcome), a forged refund, then shipped."""
    headers, body = _signed("order:7:paid", "paid")
    for _ in range(2):
        await sender.request("POST", url, headers, body, 5)
    forged, _ = _signed("order:7:refunded", "refunded")
    await sender.request("POST", url, {**forged, "webhook-signature": "v1,AAAA"},
                         b'{"order": 7, "status": "refunded"}', 5)  # fmt: skip
    shipped, body = _signed("order:7:shipped", "shipped")
    await sender.request("POST", url, shipped, body, 5)


async def test_the_nats_consumer_applies_once_terminates_a_forgery_and_survives_a_redelivery(
    nats_url: str, tmp_path: Path
) -> None:
    """JetStream keeps one of the poller's two publishes; a forgery is terminated; a
    message applied by a consumer that died before its ack comes back after ack_wait and
    is acknowledged unapplied."""
    import nats
    from nats.js.api import ConsumerConfig, StreamConfig
    from standardwebhooks import Webhook

    from poller.deliver.nats_sender import NatsSender

    consumer, ledger = _example("nats_consumer"), _example("ledger")
    tag = uuid.uuid4().hex[:8]
    subject, url = f"orders{tag}", f"{nats_url}/orders{tag}"
    client = await nats.connect(nats_url)
    js = client.jetstream()
    sender = NatsSender(allow_private=True)
    try:
        await js.add_stream(StreamConfig(name=f"ORDERS{tag}", subjects=[subject]))
        await _publish_story(sender, url)
        subscription = await js.pull_subscribe(
            subject, f"c{tag}", config=ConsumerConfig(ack_wait=1)
        )
        db, webhook = ledger.open_ledger(str(tmp_path / "orders.db")), Webhook(SECRET)
        first, second, third = await subscription.fetch(3, timeout=5)
        assert [await consumer.handle(m, webhook, db) for m in (first, second)] == [
            "applied", "rejected"
        ]  # fmt: skip
        assert ledger.apply_once(db, third.headers["webhook-id"], json.loads(third.data))
        # ... and the consumer died before its ack: JetStream hands it out again
        [again] = await subscription.fetch(1, timeout=10)
        assert await consumer.handle(again, webhook, db) == "duplicate"
        assert db.execute("SELECT id, status FROM orders").fetchall() == [(7, "shipped")]

        async def all_settled() -> bool:  # acknowledged or terminated, none left to hand out
            info = await js.consumer_info(f"ORDERS{tag}", f"c{tag}")
            return info.num_pending == 0 and info.num_ack_pending == 0

        await wait_for(all_settled, timeout=10)
    finally:
        await sender.aclose()
        await js.delete_stream(f"ORDERS{tag}")
        await client.close()


async def test_the_redis_consumer_applies_once_and_reads_its_own_pending_entries_first(
    redis_url: str, tmp_path: Path
) -> None:
    """The poller's script keeps one of two publishes; a forgery is acknowledged unapplied;
    an entry applied by a consumer that died before XACK is read again at its next start
    (its own pending entries first) and acknowledged unapplied."""
    import redis.asyncio
    from standardwebhooks import Webhook

    from poller.deliver.redis_sender import RedisSender

    consumer, ledger = _example("redis_consumer"), _example("ledger")
    stream = f"orders{uuid.uuid4().hex[:8]}"
    base = redis_url.rsplit("/", 1)[0]
    url = f"{base}/0?stream={stream}"
    client = redis.asyncio.Redis.from_url(f"{base}/0")
    sender = RedisSender(allow_private=True)
    try:
        await client.xgroup_create(stream, "billing", id="0", mkstream=True)
        await _publish_story(sender, url)
        db, webhook = ledger.open_ledger(str(tmp_path / "orders.db")), Webhook(SECRET)
        [(_, entries)] = await client.xreadgroup("billing", "w1", {stream: ">"}, count=10)
        first, second, third = entries
        said = [await consumer.handle(client, stream, "billing", e, webhook, db)
                for e in (first, second)]  # fmt: skip
        assert said == ["applied", "rejected"]
        fields = {k.decode(): v for k, v in third[1].items()}
        assert ledger.apply_once(db, fields["webhook-id"].decode(), json.loads(fields["body"]))
        # ... and the consumer died before XACK: at its next start it reads its pending first
        [(_, pending)] = await client.xreadgroup("billing", "w1", {stream: "0"}, count=10)
        assert [e[0] for e in pending] == [third[0]]
        assert await consumer.handle(client, stream, "billing", pending[0], webhook, db) == (
            "duplicate"
        )
        assert db.execute("SELECT id, status FROM orders").fetchall() == [(7, "shipped")]
        assert (await client.xpending(stream, "billing"))["pending"] == 0
    finally:
        await sender.aclose()
        await client.delete(stream)
        await client.aclose()
