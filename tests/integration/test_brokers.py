"""Destinations beyond HTTP against real brokers (poller/deliver/nats_sender.py,
amqp_sender.py, redis_sender.py): the delivery contract HTTP keeps — signed, traced,
once, in order per key, the breaker, fan-out, an unknown outcome resolved — on
JetStream, RabbitMQ and a Redis stream alike."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio
from cryptography.fernet import Fernet
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session
from standardwebhooks import Webhook

from loadtest.broker_places import Place, place
from poller import Message, enqueue_many, publish
from poller.deliver.sending import make_sender
from poller.endpoints.registry import create_endpoint, get_endpoint, new_secret, set_enabled
from poller.endpoints.view import public
from poller.errors import PrivateTarget, SendError
from tests.integration.health_helpers import health
from tests.integration.helpers import attempts_of, wait_for
from tests.integration.service_helpers import counts, fast_settings, running_poller

KINDS = ("nats", "amqp", "redis")
PARENT = f"00-{0x0AF7651916CD43DD8448EB211C80319C:032x}-{0xB7AD6B7169203331:016x}-01"


@pytest.fixture(params=KINDS)
async def where(request: pytest.FixtureRequest) -> AsyncIterator[Place]:
    """A stream or queue of the test's own on the broker of this run's parameter."""
    fixture = {"nats": "nats_url", "amqp": "amqp_url", "redis": "redis_url"}[request.param]
    async with place(request.param, {request.param: request.getfixturevalue(fixture)}) as made:
        yield made


def _span() -> NonRecordingSpan:
    context = SpanContext(
        0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331, False, TraceFlags(1)
    )
    return NonRecordingSpan(context)


def _arrived(where: Place, n: int) -> Any:
    async def check() -> bool:
        return len(await where.read()) >= n

    return check


async def test_messages_arrive_once_signed_and_traced_and_in_order_per_key(
    engine: Engine, db_url: str, where: Place
) -> None:
    secret = new_secret()
    with engine.begin() as conn:
        create_endpoint(conn, "dest", where.url, secret=secret, allow_private=True)
    messages = [
        Message("dest", "order.updated", {"n": i}, f"m{i}", ordering_key=f"k{i % 3}")
        for i in range(30)
    ]
    with Session(engine) as session, session.begin(), trace.use_span(_span()):
        enqueue_many(session, messages)
    async with running_poller(db_url, fast_settings(concurrency=8)):
        await wait_for(lambda: counts(engine).get("delivered") == 30, timeout=20)
    got = await where.read()
    assert sorted(g.id for g in got) == sorted({g.id for g in got}) and len(got) == 30
    with engine.connect() as conn:
        ids = set(conn.execute(text("SELECT idempotency_key FROM poller_outbox")).scalars())
    hook = Webhook(secret)
    for g in got:  # a consumer verifies exactly as an HTTP receiver does
        assert hook.verify(g.body, g.headers) == json.loads(g.body)
        assert g.headers["traceparent"].split("-")[1] == PARENT.split("-")[1]
        assert not {"idempotency-key", "user-agent"} & {k.lower() for k in g.headers}  # HTTP's
    assert {g.id for g in got} == ids
    for key in ("k0", "k1", "k2"):  # the key travels with the message, in its order
        seen = [json.loads(g.body)["n"] for g in got if g.headers["webhook-ordering-key"] == key]
        assert seen == sorted(seen) and len(seen) == 10


async def test_a_published_event_fans_out_to_a_broker_and_to_another(
    engine: Engine, db_url: str, where: Place, redis_url: str
) -> None:
    async with place("redis", {"redis": redis_url}) as other:
        with engine.begin() as conn:
            create_endpoint(conn, "one", where.url, event_types=["order.*"], allow_private=True)
            create_endpoint(conn, "two", other.url, event_types=["*"], allow_private=True)
        with Session(engine) as session, session.begin():
            for i in range(5):
                publish(session, event_type="order.paid", payload={"n": i}, idempotency_key=f"e{i}")
        async with running_poller(db_url, fast_settings()):
            await wait_for(_arrived(where, 5), timeout=20)
            await wait_for(_arrived(other, 5), timeout=20)
        assert len(await where.read()) == len(await other.read()) == 5


async def _publish_ahead(where: Place, engine: Engine, name: str) -> None:
    """Put the message in the stream or queue as a first attempt whose answer was lost
    would have: the same id, headers and body, no outcome recorded."""
    with engine.connect() as conn:
        webhook_id, payload = conn.execute(
            text("SELECT idempotency_key, payload::text FROM poller_outbox")
        ).one()
        endpoint = get_endpoint(conn, name)
    sender = make_sender(fast_settings())
    try:
        headers = {"webhook-id": webhook_id, "webhook-timestamp": "1", "webhook-signature": "-"}
        await sender.request("POST", endpoint.target, headers, payload.encode(), 5.0)
    finally:
        await sender.aclose()


async def test_a_resend_after_a_lost_answer_is_deduplicated_or_explained(
    engine: Engine, db_url: str, where: Place
) -> None:
    with engine.begin() as conn:
        create_endpoint(conn, "dest", where.url, allow_private=True)
    with Session(engine) as session, session.begin():
        [msg_id] = enqueue_many(session, [Message("dest", "order.paid", {"n": 1}, "once")])
    await _publish_ahead(where, engine, "dest")
    async with running_poller(db_url, fast_settings()):
        await wait_for(lambda: counts(engine).get("delivered") == 1, timeout=20)
    got = await where.read()
    [attempt] = attempts_of(engine, msg_id)
    if where.kind == "amqp":  # no server-side dedupe: two copies, one message_id
        assert len(got) == 2 and got[0].id == got[1].id
        assert '"duplicate"' not in (attempt.response_excerpt or "")
    else:  # JetStream's Nats-Msg-Id window, the Redis script's record: one copy
        assert len(got) == 1
        assert json.loads(attempt.response_excerpt)["duplicate"] is True


async def test_failed_publishes_open_the_breaker_disable_the_endpoint_and_a_probe_closes_it(
    engine: Engine, db_url: str, where: Place
) -> None:
    await where.remove()  # nowhere to publish: no stream, no queue
    if where.kind == "redis":  # a key of the wrong type: the server refuses the XADD
        async with redis.asyncio.Redis.from_url(where.server) as client:  # type: ignore[attr-defined]
            await client.set(where.name, "not a stream")
    with engine.begin() as conn:
        create_endpoint(conn, "dest", where.url, allow_private=True, max_attempts=50)
    with Session(engine) as session, session.begin():
        enqueue_many(session, [Message("dest", "e", {"n": i}, f"b{i}") for i in range(10)])
    settings = fast_settings(
        circuit_failures=3, circuit_cooldown=0.3, circuit_cooldown_max=0.3, disable_after=1.0
    )
    async with running_poller(db_url, settings):
        await wait_for(lambda: health(engine, "dest").state in ("open", "half_open"), timeout=20)
        reason = health(engine, "dest").last_error
        assert reason in {"nats": ("NoStream",), "amqp": ("Unroutable",),
                          "redis": ("BrokerRefused",)}[where.kind]  # fmt: skip
        await wait_for(lambda: not health(engine, "dest").enabled, timeout=20)  # auto-disabled
        assert health(engine, "dest").disabled_reason.startswith("failing since ")
        assert counts(engine) == {"pending": 10}  # nothing lost, nothing failed
        with engine.begin() as conn:
            set_enabled(conn, "dest", True)
        if where.kind == "redis":
            async with redis.asyncio.Redis.from_url(where.server) as client:  # type: ignore[attr-defined]
                await client.delete(where.name)
        else:
            await where.create()
        await wait_for(lambda: counts(engine).get("delivered") == 10, timeout=20)
    assert health(engine, "dest").state == "closed"
    assert sorted(await where.ids()) == sorted(set(await where.ids()))


async def test_broker_credentials_are_sealed_never_shown_and_checked(
    engine: Engine, amqp_url: str
) -> None:
    url = f"{amqp_url}?routing_key=q"
    with engine.begin() as conn:
        created = create_endpoint(conn, "rabbit", url, allow_private=True)
        stored = conn.execute(text("SELECT url, url_credentials FROM poller_endpoints")).one()
    assert "guest" not in stored.url and stored.url_credentials.endswith("guest:guest")
    assert created.endpoint.target == url
    assert "guest" not in json.dumps(public(created.endpoint), default=str)
    assert "guest" not in repr(created.endpoint)
    wrong = created.endpoint.target.replace("guest:guest", "guest:wrong")
    sender = make_sender(fast_settings())
    try:
        with pytest.raises(SendError) as refused:
            await sender.request("POST", wrong, {"webhook-id": "x"}, b"{}", 5.0)
    finally:
        await sender.aclose()
    assert refused.value.sent is False and "wrong" not in str(refused.value)


@pytest.mark.parametrize(
    "url",
    [
        "nats://10.1.2.3:4222/orders",
        "amqp://u:p@192.168.0.1/?routing_key=q",
        "redis://localhost:6379/0?stream=s",
        "rediss://[::1]/0?stream=s",
    ],
)
def test_a_broker_on_a_private_address_is_refused_as_an_http_one_is(
    engine: Engine, url: str
) -> None:
    with engine.begin() as conn, pytest.raises(PrivateTarget):
        create_endpoint(conn, "inside", url, allow_private=False)


async def test_a_broker_name_resolving_inside_is_refused_at_connect() -> None:
    from poller.deliver.nats_sender import NatsSender

    async def inside(host: str, port: int) -> list[str]:
        return ["127.0.0.1"]

    sender = NatsSender(allow_private=False, resolve=inside)
    with pytest.raises(SendError, match=r"refused: .*loopback") as refused:
        await sender.request("POST", "nats://broker.example:4222/a", {"webhook-id": "x"}, b"", 1)
    assert refused.value.sent is False
    await asyncio.wait_for(sender.aclose(), 5)


def test_the_cli_takes_a_broker_url_and_never_prints_its_credentials(
    db_url: str, engine: Engine
) -> None:
    from click.testing import CliRunner

    from poller.cli import cli

    env = {"POLLER_DATABASE_URL": db_url, "POLLER_SECRETS_KEY": Fernet.generate_key().decode()}
    runner = CliRunner()
    url = "amqp://app:s3cret@rabbit.example/orders?exchange=hooks&routing_key=acme"
    for args in (
        ["add", "rabbit", url],
        ["show", "rabbit"],
        ["list"],
        ["show", "rabbit", "--json"],
    ):
        result = runner.invoke(cli, ["endpoints", *args], env=env)
        assert result.exit_code == 0 and "rabbit.example" in result.output, result.output
        assert "s3cret" not in result.output and "app:" not in result.output
    with engine.connect() as conn:
        sealed = conn.execute(text("SELECT url_credentials FROM poller_endpoints")).scalar_one()
    assert sealed.startswith("fernet:") and "s3cret" not in sealed
    bad = runner.invoke(cli, ["endpoints", "add", "x", "nats://n.example/orders.*"], env=env)
    assert bad.exit_code == 2 and bad.output.count("\n") == 1 and "subject" in bad.output


async def test_an_operators_tools_work_on_a_broker_as_on_http(
    engine: Engine, db_url: str, redis_url: str
) -> None:
    """Pause, cancel, max_attempts and replay, on a Redis stream (the others are the same
    code above the seam)."""
    from datetime import UTC, datetime, timedelta

    from poller.operate.cancel import cancel_messages, pause_endpoint, resume_endpoint
    from poller.operate.replay import replay

    async with (
        place("redis", {"redis": redis_url}) as where,
        place("redis", {"redis": redis_url}) as refusing,
        redis.asyncio.Redis.from_url(redis_url) as client,
    ):
        await client.set(refusing.name, "not a stream")
        with engine.begin() as conn:
            create_endpoint(conn, "dest", where.url, event_types=["e.*"], allow_private=True)
            create_endpoint(conn, "wrong", refusing.url, allow_private=True, max_attempts=2)
            pause_endpoint(conn, "dest")
        with Session(engine) as session, session.begin():
            publish(session, event_type="e.one", payload={"n": 1}, idempotency_key="one")
            later = datetime.now(UTC) + timedelta(hours=1)
            [doomed, refused] = enqueue_many(session, [
                Message("dest", "e.two", {"n": 2}, "two", deliver_after=later),
                Message("wrong", "e.x", {"n": 3}, "three"),
            ])  # fmt: skip
        assert cancel_messages(engine, [doomed]).cancelled == [doomed]
        async with running_poller(db_url, fast_settings()):
            await wait_for(lambda: counts(engine).get("failed") == 1, timeout=20)
            assert await where.read() == []  # paused: nothing published
            with engine.begin() as conn:
                resume_endpoint(conn, "dest")
            await wait_for(lambda: counts(engine).get("delivered") == 1, timeout=20)
            [first] = await client.xrange(where.name)
            await client.xdel(where.name, first[0])  # the stream lost it
            again = replay(engine, "dest", since=datetime.now(UTC) - timedelta(minutes=5))
            assert again.resent == 1, again
            await wait_for(_arrived(where, 1), timeout=20)
        assert [g.id for g in await where.read()] == ["one"]  # put back, once
    assert [a.outcome for a in attempts_of(engine, refused)] == ["retry", "failed"]
    assert all(a.error_class == "BrokerRefused" for a in attempts_of(engine, refused))


async def test_a_jetstream_window_shorter_than_the_retry_schedule_is_said_once(
    nats_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    from loadtest.broker_places import NatsPlace
    from poller.deliver.nats_sender import NatsSender

    sender = NatsSender(allow_private=True, retry_span=3600)
    try:
        for window in (60, 7200):
            async with NatsPlace(nats_url, window=window) as where:
                for n in range(2):
                    await sender.request("POST", where.url, {"webhook-id": f"w{n}"}, b"{}", 5)
    finally:
        await sender.aclose()
    said = [r.getMessage() for r in caplog.records if "duplicate_window" in r.getMessage()]
    assert len(said) == 1 and "within 60 s" in said[0] and "3600 s" in said[0]


def _redis_opened() -> float:
    """Connections the Redis sender opened so far (its counter)."""
    from poller.observe.metrics import BROKER_CONNECTIONS

    return BROKER_CONNECTIONS.labels("redis", "opened")._value.get()


async def test_connections_are_kept_and_a_lost_one_is_opened_again_and_counted(
    redis_url: str,
) -> None:
    from poller.deliver.redis_sender import RedisSender

    before = _redis_opened()
    sender = RedisSender(allow_private=True)
    stream = f"kept-{uuid.uuid4().hex[:8]}"
    url = f"{redis_url}?stream={stream}"
    try:
        for n in range(5):
            await sender.request("POST", url, {"webhook-id": f"c{n}"}, b"{}", 5)
        assert _redis_opened() == before + 1  # one connection, reused
        async with redis.asyncio.Redis.from_url(redis_url) as admin:
            await admin.client_kill_filter(_type="normal", skipme=True)
        # the pool finds it closed before sending on it: one more connection, no resend
        await sender.request("POST", url, {"webhook-id": "c5"}, b"{}", 5)
        assert _redis_opened() == before + 2
        async with redis.asyncio.Redis.from_url(redis_url) as admin:
            assert await admin.xlen(stream) == 6
    finally:
        await sender.aclose()


async def test_a_burst_to_a_redis_stream_shares_a_round_trip_and_each_answer_is_its_own(
    redis_url: str,
) -> None:
    """One loop turn's publishes go as one pipeline (one connection, where single calls
    took one each); a refusal is its publish's alone; a server that lost the script has
    it again and adds each entry once."""
    from poller.deliver.redis_sender import RedisSender, id_key

    before = _redis_opened()
    sender = RedisSender(allow_private=True)
    stream = f"burst-{uuid.uuid4().hex[:8]}"
    url = f"{redis_url}?stream={stream}"

    async def burst(ids: list[str]) -> list[Any]:
        sends = [sender.request("POST", url, {"webhook-id": i}, b"{}", 5) for i in ids]
        return await asyncio.gather(*sends, return_exceptions=True)

    try:
        async with redis.asyncio.Redis.from_url(redis_url) as admin:
            await admin.hset(id_key(stream, "b3"), "not", "an id")  # its script call fails
            first = await burst([f"b{n}" for n in range(20)])
            assert _redis_opened() == before + 1  # 20 at once: one connection, one round trip
            refused = first.pop(3)
            assert isinstance(refused, SendError) and refused.error_class == "BrokerRefused"
            assert refused.sent is False and "WRONGTYPE" in str(refused)
            assert all(reply.status == 200 for reply in first)
            await admin.script_flush()
            again = await burst([f"b{n}" for n in range(5, 25)])  # 15 again, 5 new
            duplicate = [json.loads(reply.body)["duplicate"] for reply in again]
            assert duplicate == [True] * 15 + [False] * 5
            assert await admin.xlen(stream) == 24
    finally:
        await sender.aclose()


async def test_a_rate_limit_paces_publishes_to_a_broker(
    engine: Engine, db_url: str, redis_url: str
) -> None:
    async with place("redis", {"redis": redis_url}) as where:
        with engine.begin() as conn:
            create_endpoint(conn, "dest", where.url, allow_private=True, rate_limit=10,
                            rate_burst=1)  # fmt: skip
        with Session(engine) as session, session.begin():
            enqueue_many(session, [Message("dest", "e", {"n": i}, f"r{i}") for i in range(12)])
        async with running_poller(db_url, fast_settings()):
            await wait_for(_arrived(where, 12), timeout=20)
        async with redis.asyncio.Redis.from_url(redis_url) as client:
            entries = [int(e.split(b"-")[0]) for e, _ in await client.xrange(where.name)]
    assert (entries[-1] - entries[0]) / 1000 >= 11 / 10 * 0.9  # the stream's own clock


async def test_a_payload_over_the_nats_servers_limit_is_refused_unsent(nats_url: str) -> None:
    from loadtest.broker_places import NatsPlace
    from poller.deliver.nats_sender import NatsSender

    sender = NatsSender(allow_private=True)
    try:
        async with NatsPlace(nats_url) as where:
            with pytest.raises(SendError, match="maximum payload") as refused:
                await sender.request("POST", where.url, {"webhook-id": "big"}, b"x" * 2**21, 5)
            assert refused.value.sent is False and refused.value.error_class == "BrokerRefused"
            await sender.request("POST", where.url, {"webhook-id": "small"}, b"{}", 5)  # kept
            assert await where.ids() == ["small"]
    finally:
        await sender.aclose()


async def test_an_http_url_in_capitals_still_goes_to_the_http_sender() -> None:
    from tests.integration.service_helpers import running_receiver

    sender = make_sender(fast_settings())
    try:
        async with running_receiver() as (_, url):
            reply = await sender.request("POST", url.replace("http://", "HTTP://") + "/x",
                                         {"webhook-id": "caps"}, b"{}", 5)  # fmt: skip
        assert reply.status != 0
    finally:
        await sender.aclose()


async def test_a_pubacks_answer_is_json_whatever_the_streams_name(nats_url: str) -> None:
    """JetStream takes a stream name with a quote or a bidi control: the answer recorded for
    the attempt stays JSON and names it."""
    import nats
    from nats.js.api import StreamConfig

    from poller.deliver.nats_sender import NatsSender

    name, subject = f'odd"\u202e{uuid.uuid4().hex[:8]}', f"odd{uuid.uuid4().hex[:8]}"
    client = await nats.connect(nats_url)
    sender = NatsSender(allow_private=True)
    try:
        await client.jetstream().add_stream(StreamConfig(name=name, subjects=[subject]))
        reply = await sender.request("POST", f"{nats_url}/{subject}", {"webhook-id": "q"}, b"{}", 5)
        again = await sender.request("POST", f"{nats_url}/{subject}", {"webhook-id": "q"}, b"{}", 5)
        assert json.loads(reply.body) == {"stream": name, "seq": 1, "duplicate": False}
        assert json.loads(again.body) == {"stream": name, "seq": 1, "duplicate": True}
    finally:
        await sender.aclose()
        await client.jetstream().delete_stream(name)
        await client.close()


async def test_jetstreams_refusal_an_answer_that_is_no_puback_and_a_lost_connection(
    nats_url: str,
) -> None:
    """The sender reads PubAcks itself: a stream at its limit refuses (not sent), a core
    NATS responder's answer is no PubAck (maybe had: unknown), and a connection lost
    while a publish waits answers it at once as unknown, not at its timeout."""
    import nats
    from nats.js.api import DiscardPolicy, StreamConfig

    from poller.deliver.nats_sender import NatsSender

    tag = uuid.uuid4().hex[:8]
    client = await nats.connect(nats_url)
    js = client.jetstream()
    sender = NatsSender(allow_private=True)

    async def answer_hello(msg: Any) -> None:
        await msg.respond(b"hello")

    async def send(subject: str, webhook_id: str, timeout: float = 5) -> Any:
        return await sender.request("POST", f"{nats_url}/{subject}", {"webhook-id": webhook_id},
                                    b"{}", timeout)  # fmt: skip

    try:
        await js.add_stream(StreamConfig(name=f"FULL{tag}", subjects=[f"full{tag}"], max_msgs=1,
                                         discard=DiscardPolicy.NEW))  # fmt: skip
        await send(f"full{tag}", "one")
        with pytest.raises(SendError, match="maximum messages") as full:
            await send(f"full{tag}", "two")
        assert full.value.error_class == "BrokerRefused" and full.value.sent is False
        await client.subscribe(f"core{tag}", cb=answer_hello)
        await client.flush()
        with pytest.raises(SendError, match="not a JetStream PubAck") as core:
            await send(f"core{tag}", "three")
        assert core.value.error_class == "NotJetStream" and core.value.sent is True
        heard = asyncio.Event()

        async def never_answer(msg: Any) -> None:
            heard.set()

        await client.subscribe(f"mute{tag}", cb=never_answer)
        await client.flush()
        waiting = asyncio.create_task(send(f"mute{tag}", "four", timeout=30))
        await asyncio.wait_for(heard.wait(), 5)
        link = sender._links._clients[(f"{nats_url}/mute{tag}", None)]
        await link.client.close()  # as a broker's restart would
        async with asyncio.timeout(5):  # at once, not in 30 s
            with pytest.raises(SendError) as lost:
                await waiting
        assert lost.value.error_class == "ConnectionLost" and lost.value.sent is True
        await send(f"full{tag}", "one")  # a new connection; the duplicate window has it
    finally:
        await sender.aclose()
        await js.delete_stream(f"FULL{tag}")
        await client.close()


async def test_each_publish_waits_its_own_timeout_on_a_shared_connection(nats_url: str) -> None:
    """The publishes of a connection share one timer: each still ends at its own deadline,
    whatever order they were made in, and an answer meanwhile changes none of them."""
    import nats

    from poller.deliver.nats_sender import NatsSender

    subject = f"mute{uuid.uuid4().hex[:8]}"
    client = await nats.connect(nats_url)
    sender = NatsSender(allow_private=True)
    loop = asyncio.get_running_loop()

    async def answer_one(msg: Any) -> None:
        """Answers the publish named "answered" as JetStream would; hears the others."""
        if msg.headers["webhook-id"] == "answered":
            await msg.respond(b'{"stream":"MUTE","seq":1}')

    async def send(webhook_id: str, timeout: float) -> Any:
        return await sender.request("POST", f"{nats_url}/{subject}", {"webhook-id": webhook_id},
                                    b"{}", timeout)  # fmt: skip

    async def timed_out_after(timeout: float) -> float:
        began = loop.time()
        with pytest.raises(SendError) as late:
            await send(str(timeout), timeout)
        assert late.value.error_class == "PublishTimeout" and late.value.sent is True
        return loop.time() - began

    timeouts = (0.8, 0.2, 1.2, 0.5)
    try:
        await client.subscribe(subject, cb=answer_one)
        await client.flush()
        waits = [asyncio.create_task(timed_out_after(t)) for t in timeouts]
        assert (await send("answered", 5)).status == 200
        async with asyncio.timeout(10):
            took = await asyncio.gather(*waits)
        for timeout, spent in zip(timeouts, took, strict=True):
            assert timeout - 0.01 <= spent < timeout + 0.4, (timeout, spent)
    finally:
        await sender.aclose()
        await client.close()


async def test_a_publish_that_crashes_leaves_nothing_waiting(nats_url: str) -> None:
    """A publish that fails in the client with no NATS error of its own (here a header
    value that is not text) takes its reply subject and future with it: nothing is left
    for the connection's timer to fail unseen later."""
    from poller.deliver.nats_sender import NatsSender

    url = f"{nats_url}/crash{uuid.uuid4().hex[:8]}"
    sender = NatsSender(allow_private=True)
    try:
        with pytest.raises(AttributeError):
            await sender.request("POST", url, {"webhook-id": "x", "n": 5}, b"{}", 5)
        assert sender._links._clients[(url, None)].acks._waiting == {}
    finally:
        await sender.aclose()
