"""The holes an attacker or a pessimist found (guarantees G9, G11), each closed and kept closed.

* whatever a delivery raises is a counted, recorded attempt — never a loop;
* a failure between a claim and its sends spends no attempt and drops nothing;
* a claim whose outcome is slow to be written is kept by the lease heartbeat;
* a supervised loop that crashes stops the poller loudly (ServiceCrashed, 503).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from poller import enqueue
from poller.errors import ServiceCrashed
from poller.local.embedded import free_port
from poller.observe import metrics
from poller.service.runner import Poller
from poller.store import queries
from tests.conftest import make_endpoint
from tests.integration import senders, servers
from tests.integration.helpers import attempts_of, row, seed, wait_for
from tests.integration.service_helpers import (
    counts,
    fast_settings,
    running_poller,
    running_receiver,
    serving,
)

if TYPE_CHECKING:
    from poller.complete.completer import Completer
    from poller.rows.claims import Claims
    from poller.rules.outcomes import ClaimedMessage


def _counting(handler: servers.Handler, seen: list[bytes]) -> servers.Handler:
    async def counted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(b"POST")
        await handler(reader, writer)

    return counted


async def _until_settled(engine: Engine, total: int, timeout: float = 20) -> None:
    async def settled() -> bool:
        found = counts(engine)
        return found.get("delivered", 0) + found.get("failed", 0) == total

    await wait_for(settled, timeout=timeout)


@pytest.mark.parametrize("retry_after", ["²", "٣", "1e9", "-5", "\udcff", "9" * 300])
async def test_a_hostile_retry_after_spends_attempts_and_ends_failed(
    engine: Engine, db_url: str, retry_after: str
) -> None:
    seen: list[bytes] = []
    header = f"Retry-After: {retry_after}\r\n".encode("utf-8", "surrogateescape")

    async def answer_429(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await servers.read_request(reader)
        writer.write(b"HTTP/1.1 429 Slow Down\r\nContent-Length: 0\r\n" + header + b"\r\n")
        await writer.drain()

    async with servers.raw_server(_counting(answer_429, seen)) as url:
        make_endpoint(engine, "a", url=url, max_attempts=3)
        (msg_id,) = seed(engine, 1, "a")
        async with running_poller(db_url, fast_settings()):
            await _until_settled(engine, 1)
    stored = row(engine, msg_id)
    assert (stored.status, stored.attempts, stored.last_status_code) == ("failed", 3, 429)
    assert len(seen) == 3 == len(attempts_of(engine, msg_id))


def _break(engine: Engine, column: str, value: str) -> None:
    """Store a value the API would refuse today (rows written by an older version)."""
    with engine.begin() as conn:
        conn.execute(text(f"UPDATE poller_endpoints SET {column} = :v"), {"v": value})


@pytest.mark.parametrize("client", senders.KINDS)
@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("url", "http://0177.0.0.1:{port}/"),
        ("url", "http://xn--zz/"),
        ("url", "http://[::1/"),
        ("secret", "whsec_!!!not base64"),
        ("secret", "whsec_\u00e9t\u00e9"),
        ("lookup_url", "http://xn--zz/{{idempotency_key}}"),
        ("headers", 'headers:[["X-Token", "s3cret\\r\\nX-Evil: 1"]]'),
    ],
)
async def test_values_a_client_cannot_use_are_counted_attempts(
    engine: Engine, db_url: str, client: str, column: str, value: str
) -> None:
    async with running_receiver() as (receiver, url):
        port = url.rpartition(":")[2]
        make_endpoint(engine, "a", url=url, max_attempts=2)
        _break(engine, column, value.format(port=port))
        (msg_id,) = seed(engine, 1, "a")
        if column == "lookup_url":  # only an unknown outcome makes the poller look up
            with engine.begin() as conn:
                conn.execute(text("UPDATE poller_outbox SET needs_lookup = true"))
        async with running_poller(db_url, fast_settings(http_client=client)):
            await _until_settled(engine, 1)
    stored = row(engine, msg_id)
    recorded = attempts_of(engine, msg_id)
    assert stored.attempts <= 2 and len(recorded) == stored.attempts
    assert all(a.error_class for a in recorded if a.outcome != "delivered")
    assert not any("s3cret" in (a.error_message or "") for a in recorded)  # a credential
    if client == "reqwest" and value.startswith("http://0177."):
        # reqwest reads hosts as browsers do (WHATWG): 0177.0.0.1 is 127.0.0.1, allowed here
        assert stored.status == "delivered"
    elif column != "lookup_url":
        assert stored.status == "failed" and receiver.stats.received == 0


DIES = queries.Statement(  # the endpoint read, killing its own connection
    "ENDPOINTS_BY_ID",
    "SELECT * FROM poller_endpoints WHERE id = ANY(CAST(:ids AS bigint[])) "
    "AND pg_terminate_backend(pg_backend_pid())",
)


async def test_a_failure_between_claim_and_send_spends_no_attempt(
    engine: Engine, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The endpoint read after a claim fails: the claim (one statement, committed) hands
    its messages back unsent, the attempt refunded — neither dropped nor charged."""
    original = queries.ENDPOINTS_BY_ID
    monkeypatch.setattr(queries, "ENDPOINTS_BY_ID", DIES)
    errors = metrics.sample_total(metrics.DB_ERRORS)
    async with running_receiver() as (receiver, url):
        make_endpoint(engine, "a", url=url)
        (msg_id,) = seed(engine, 1, "a")
        async with running_poller(db_url, fast_settings()):

            async def failed() -> bool:
                return metrics.sample_total(metrics.DB_ERRORS) > errors

            await wait_for(failed)
            monkeypatch.setattr(queries, "ENDPOINTS_BY_ID", original)
            await _until_settled(engine, 1, timeout=10)
    stored = row(engine, msg_id)
    # handed back (once, or again while the read kept failing), never charged
    assert stored.attempts == 1 and 1 <= stored.refunds <= 3
    assert receiver.stats.received == 1


async def test_a_failure_after_a_governed_claim_hands_its_messages_back(
    engine: Engine, aengine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CLAIM_GOVERNED committed its claims, then CLAIM_BATCH failed: the governed messages
    come back unready, for the claimer to hand back, instead of staying in flight until
    their lease runs out (the hunt's DBA found it)."""
    from poller.rows.claims import Claims

    make_endpoint(engine, "a", url="http://127.0.0.1:9/")
    with engine.begin() as conn:  # a rate limit: its messages are claimed governed
        conn.execute(text("UPDATE poller_endpoints SET rate_limit = 20, rate_burst = 4"))
        conn.execute(text("UPDATE poller_endpoint_health SET tokens = 4, tokens_at = now()"))
    (msg_id,) = seed(engine, 1, "a")
    kills = queries.Statement("CLAIM_BATCH", "SELECT pg_terminate_backend(pg_backend_pid())")
    monkeypatch.setattr(queries, "CLAIM_BATCH", kills)
    claims = Claims(aengine, poller_id="p1", claim_lease=30)
    try:
        batch = await claims.claim(10, endpoint_versions={}, governed=True)
    finally:
        await claims.close()
    assert [m.id for m in batch.unready] == [msg_id] and batch.error is not None
    assert not batch.messages


async def test_a_claim_in_a_transaction_is_rolled_back_whole(
    engine: Engine, aengine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without an endpoint cache the claim and its endpoint read are one transaction:
    the read failing rolls the claim back (no attempt counted, nothing in flight)."""
    from poller.rows.claims import Claims

    monkeypatch.setattr(queries, "ENDPOINTS_BY_ID", DIES)
    make_endpoint(engine, "a", url="http://127.0.0.1:9/")
    (msg_id,) = seed(engine, 1, "a")
    with pytest.raises(Exception):  # noqa: B017 - whatever the driver says
        await Claims(aengine, poller_id="p1", claim_lease=30).claim(10)
    stored = row(engine, msg_id)
    assert (stored.status, stored.attempts) == ("pending", 0)


async def test_a_slow_outcome_write_keeps_its_claim_through_the_heartbeat(
    engine: Engine, db_url: str
) -> None:
    """On its last attempt a delivered message must end delivered, however late the write."""
    async with running_receiver() as (receiver, url):
        make_endpoint(engine, "a", url=url, max_attempts=1)
        (msg_id,) = seed(engine, 1, "a")
        async with running_poller(db_url, fast_settings(claim_lease=3.0)) as poller:
            gate = asyncio.Event()
            complete = poller.claims.complete

            async def slow_complete(outcomes: Any) -> Any:
                await gate.wait()
                return await complete(outcomes)

            poller.claims.complete = slow_complete  # type: ignore[method-assign]

            async def sent() -> bool:
                return receiver.stats.received == 1

            await wait_for(sent)
            first_expiry = row(engine, msg_id).claim_expires_at

            async def well_past_the_first_lease() -> bool:
                with engine.connect() as conn:
                    now = conn.execute(text("SELECT now()")).scalar_one()
                return bool((now - first_expiry).total_seconds() > 1.0)

            await wait_for(well_past_the_first_lease, timeout=10)
            assert row(engine, msg_id).status == "in_flight"  # held, not reclaimed
            gate.set()
            await _until_settled(engine, 1)
    assert row(engine, msg_id).status == "delivered"
    assert [a.outcome for a in attempts_of(engine, msg_id)] == ["delivered"]


# --- crash-only ---------------------------------------------------------------------


class _Boom:
    async def run_once(self) -> int:
        raise RuntimeError("injected")


async def _raise(*_: Any, **__: Any) -> Any:
    raise RuntimeError("injected")


def _inject(poller: Poller, loop: str) -> None:
    if loop == "claimer":
        poller.claims.claim = _raise  # type: ignore[method-assign]
    elif loop == "completer":
        poller.claims.complete = _raise  # type: ignore[method-assign]
    elif loop == "listener":
        poller.claimer._wants = lambda payload: 1 / 0  # type: ignore[method-assign, assignment, return-value]
    elif loop == "shard-manager":
        assert poller.shards is not None
        poller.shards.elector.heartbeat = _raise  # type: ignore[method-assign]
    else:
        (periodic,) = [p for p in poller.periodic if p.name == loop]
        periodic.service = _Boom()


LOOPS = [
    "claimer",
    "completer",
    "listener",
    "lease-keeper",
    "reclaimer",
    "gauges",
    "purger",
    "shard-manager",
]


@pytest.mark.parametrize("loop", LOOPS)
async def test_a_crashed_loop_stops_the_poller_gracefully_and_loudly(
    engine: Engine, db_url: str, loop: str
) -> None:
    crashes = metrics.sample_total(metrics.LOOP_CRASHES, loop=loop)
    async with running_receiver() as (_, url):
        make_endpoint(engine, "a", url=url)
        settings = fast_settings(election="postgres", lease_ttl=1.5)
        async with serving(db_url, settings) as (poller, task):
            _inject(poller, loop)
            with Session(engine) as session, session.begin():  # something for every loop to do
                enqueue(session, endpoint="a", event_type="e", payload={}, idempotency_key="k")
            while not task.done():  # NOTIFY until the listener, connecting meanwhile, hears one
                with engine.begin() as conn:
                    conn.execute(text("NOTIFY poller_outbox, '0'"))
                await asyncio.wait([task], timeout=0.1)
            with pytest.raises(ServiceCrashed, match=loop):
                await task
    assert metrics.sample_total(metrics.LOOP_CRASHES, loop=loop) == crashes + 1
    assert counts(engine).get("in_flight", 0) == 0 or loop == "completer"  # released
    with engine.connect() as conn:
        live = conn.execute(text("SELECT count(*) FROM poller_leases WHERE expires_at > now()"))
        assert live.scalar_one() == 0  # every lease given up


async def test_healthz_turns_unhealthy_when_a_loop_crashes(engine: Engine, db_url: str) -> None:
    from poller.local.receiver import Faults

    port = free_port()
    async with running_receiver(Faults(latency=1.5)) as (_, url):
        make_endpoint(engine, "a", url=url)
        seed(engine, 1, "a")
        settings = fast_settings(metrics_addr=f"127.0.0.1:{port}", request_timeout=3, claim_lease=8)
        async with serving(db_url, settings) as (poller, task), httpx.AsyncClient() as http:
            health = f"http://127.0.0.1:{port}/healthz"
            assert (await http.get(health)).status_code == 200

            async def delivering() -> bool:
                return bool(poller.dispatcher.tasks)

            await wait_for(delivering)
            poller.claims.claim = _raise  # type: ignore[method-assign]
            poller.claimer.wake.set()

            async def unhealthy() -> bool:
                answer = await http.get(health)
                return answer.status_code == 503 and "claimer" in answer.json()["reason"]

            await wait_for(unhealthy)  # while the in-flight delivery drains
            with pytest.raises(ServiceCrashed):
                await asyncio.wait_for(task, 30)
    assert counts(engine) == {"delivered": 1}  # the drain let it finish


@pytest.mark.parametrize(
    "payload", ["²", "٣", "-1", "", "1e3", "999999999999999999999", "x", "1" * 5000]
)
def test_a_notify_payload_that_is_not_a_bucket_is_ignored(payload: str) -> None:
    from types import SimpleNamespace

    from poller.claim.claimer import Claimer
    from poller.claim.shards import ClaimScope

    claimer = SimpleNamespace(scope=lambda: ClaimScope((1, 2), None, 1, maintenance=False))
    assert Claimer._wants(claimer, payload) is False  # type: ignore[arg-type]
    # nor does it count for the governed claim where every bucket is the poller's
    everything = SimpleNamespace(
        scope=lambda: ClaimScope(None, None, 1, maintenance=True),
        wake=asyncio.Event(),
        endpoints=SimpleNamespace(rate_limited_in=lambda bucket: True),
        _limited_notes=0,
        _news=False,
        _news_bucket=None,
    )
    everything._wants = lambda payload: Claimer._wants(everything, payload)  # type: ignore[arg-type]
    Claimer._notified(everything, payload)  # type: ignore[arg-type]
    assert everything.wake.is_set() and everything._limited_notes == 0
    assert everything._news_bucket is None  # no bucket to walk first


async def deliver(batch: Any, completer: Any, settings: Any) -> dict[int, Any]:
    """Deliver a claim's messages (held by ``completer`` already) through a Dispatcher, as
    the Claimer would; their outcomes by message id."""
    from poller.deliver.dispatcher import Dispatcher, EndpointCache
    from poller.deliver.sending import make_sender

    cache = EndpointCache()
    cache.update(batch.endpoints)
    sender = make_sender(settings)
    dispatcher = Dispatcher(settings, sender, cache, completer)
    for msg in batch.messages:
        dispatcher.start(msg, time.monotonic())
    await asyncio.wait(list(dispatcher.tasks))
    await sender.aclose()
    found = [completer._waiting.popleft() for _ in batch.messages]
    return {o.message_id: o for o in found}


async def test_a_message_the_claim_found_aged_out_is_never_sent_whatever_this_clock_says(
    engine: Engine, aengine: Any
) -> None:
    """CLAIM_GOVERNED ages a backlog out by the database's clock; a poller whose clock is
    behind must fail those unsent too, not send them to an endpoint whose circuit is open."""
    import dataclasses

    from poller.complete.completer import Completer
    from poller.rows.claims import Claims

    async with running_receiver() as (receiver, url):
        make_endpoint(engine, "a", url=url, max_age=600.0)
        seed(engine, 2, "a")
        claimer = Claims(aengine, poller_id="p1", claim_lease=30)
        batch = await claimer.claim(10)
        aged = dataclasses.replace(batch.messages[0], expired=True)  # fresh by this clock
        batch.messages[0] = aged
        completer = Completer(claimer)
        for msg in batch.messages:
            completer.hold(msg)
        outcomes = await deliver(batch, completer, fast_settings())
    assert (outcomes[aged.id].status, outcomes[aged.id].outcome) == ("failed", "expired")
    assert outcomes[batch.messages[1].id].status == "delivered"
    assert receiver.stats.received == 1


async def test_a_claim_past_its_lease_by_this_clock_is_handed_back_unsent(
    engine: Engine, aengine: Any
) -> None:
    """A poller paused (SIGSTOP, a long GC, a VM migration) between its claim and its
    send must not send: the row may be another poller's by now."""
    from poller.complete.completer import Completer
    from poller.rows.claims import Claims
    from poller.rules import outcomes as claim_outcomes

    async with running_receiver() as (receiver, url):
        make_endpoint(engine, "a", url=url)
        seed(engine, 2, "a")
        claimer = Claims(aengine, poller_id="p1", claim_lease=30)
        batch = await claimer.claim(10)
        completer = Completer(claimer)
        paused, fresh = batch.messages
        completer.hold(paused, claimed_at=time.monotonic() - 31)  # "woke up" after the lease
        completer.hold(fresh)
        outcomes = await deliver(batch, completer, fast_settings())
    assert outcomes[paused.id].status == claim_outcomes.released(paused).status
    assert outcomes[paused.id].kind is None  # nothing on the wire
    assert outcomes[fresh.id].status == "delivered"
    assert receiver.stats.received == 1


async def test_no_request_starts_without_its_timeout_of_lease_to_spare(
    engine: Engine, aengine: Any
) -> None:
    """The heartbeat cannot reach the database: a claim whose lease has less left than
    the request timeout plus LEASE_MARGIN is handed back unsent, though the lease has
    not run out yet (a send then could outlive it, and the row be sent again beside it)."""
    from poller.complete.completer import LEASE_MARGIN, Completer
    from poller.local.embedded import free_port
    from poller.rows.claims import Claims
    from poller.store.db import poller_engine

    settings = fast_settings(claim_lease=3.0, request_timeout=1.0)
    async with running_receiver() as (receiver, url):
        make_endpoint(engine, "a", url=url)
        seed(engine, 2, "a")
        batch = await Claims(aengine, poller_id="p1", claim_lease=3.0).claim(10)
        unreachable = poller_engine(f"postgresql+psycopg://u:p@127.0.0.1:{free_port()}/x", settings)
        completer = Completer(Claims(unreachable, poller_id="p1", claim_lease=3.0))
        short, roomy = batch.messages
        left = 1.0 + LEASE_MARGIN - 0.2  # 1.3 s of a 3 s lease: not enough for a 1 s send
        completer.hold(short, claimed_at=time.monotonic() - (3.0 - left))
        completer.hold(roomy)
        with pytest.raises(Exception):  # noqa: B017 - whatever psycopg says
            await completer.extend_leases()
        outcomes = await deliver(batch, completer, settings)
        await unreachable.dispose()
    assert (outcomes[short.id].outcome, outcomes[short.id].kind) == ("released", None)
    assert outcomes[roomy.id].status == "delivered"
    assert receiver.stats.received == 1


async def test_a_dot_segment_key_stored_before_they_were_refused_is_never_looked_up(
    engine: Engine, aengine: Any
) -> None:
    """``…/webhooks/..`` resolves to ``…/``: a 200 there (a home page) would mark the
    unprocessed message delivered. Such a key is sent instead (the receiver dedupes
    on webhook-id); new ones are refused at enqueue (test_enqueue)."""
    from poller.complete.completer import Completer
    from poller.rows.claims import Claims
    from tests.integration.servers import raw_server, read_request

    requests: list[bytes] = []

    async def home_page(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        requests.append((await read_request(reader)).split(b"\r\n", 1)[0])
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\nConnection: close\r\n\r\nhome")
        await writer.drain()

    async with raw_server(home_page) as base:
        make_endpoint(engine, "a", url=f"{base}/hook", lookup_url=f"{base}/w/{{idempotency_key}}")
        seed(engine, 1, "a")
        with engine.begin() as conn:
            conn.execute(
                text("UPDATE poller_outbox SET idempotency_key = '..', needs_lookup = true")
            )
        claims = Claims(aengine, poller_id="p1", claim_lease=30)
        batch = await claims.claim(10)
        completer = Completer(claims)
        for msg in batch.messages:
            completer.hold(msg)
        (outcome,) = (await deliver(batch, completer, fast_settings())).values()
    assert (outcome.status, outcome.kind) == ("delivered", "send")
    assert requests == [b"POST /hook HTTP/1.1"]


async def _one_held(engine: Engine, aengine: Any) -> tuple[Claims, Completer, ClaimedMessage]:
    """One message claimed and held by a completer (not running yet): claims, completer,
    message."""
    from poller.complete.completer import Completer
    from poller.rows.claims import Claims

    make_endpoint(engine, "a", url="http://127.0.0.1:9/")
    seed(engine, 1, "a")
    claims = Claims(aengine, poller_id="p1", claim_lease=30)
    (msg,) = (await claims.claim(10)).messages
    completer = Completer(claims)
    completer.hold(msg)
    return claims, completer, msg


async def test_a_heartbeat_meeting_an_outcome_write_counts_no_claim_lost(
    engine: Engine, aengine: Any
) -> None:
    """The heartbeat's statement can run after an outcome's write committed and before
    the completer let go of the row: the row is no longer in flight, yet nobody took it
    over — no warning, no claims_lost (an alert on it would fire on every busy poller)."""
    from poller.rules import outcomes

    claims, completer, msg = await _one_held(engine, aengine)
    committed, go_on = asyncio.Event(), asyncio.Event()
    complete = claims.complete

    async def paused(batch: Any) -> Any:
        result = await complete(batch)
        committed.set()
        await go_on.wait()
        return result

    claims.complete = paused  # type: ignore[method-assign]
    lost = metrics.sample_total(metrics.CLAIMS_LOST)
    writer = asyncio.create_task(completer.run())
    try:
        completer.put(outcomes.delivered(msg, status_code=200))
        await asyncio.wait_for(committed.wait(), 10)
        assert await completer.extend_leases() == 0  # delivered: nothing left to extend
        assert metrics.sample_total(metrics.CLAIMS_LOST) == lost
        assert msg.id in completer.held  # the write lets go of it
        go_on.set()
        assert await completer.flush(10)
    finally:
        writer.cancel()
    assert msg.id not in completer.held and row(engine, msg.id).status == "delivered"


async def test_a_write_made_during_a_heartbeat_counts_no_claim_lost(
    engine: Engine, aengine: Any
) -> None:
    """An outcome written and let go of, whole, while a heartbeat's statement is on its
    way: the row left the heartbeat's snapshot of held claims as done, not taken over
    (a single poller draining warned of 59-100 such claims a round)."""
    from poller.rules import outcomes

    claims, completer, msg = await _one_held(engine, aengine)
    entered, written = asyncio.Event(), asyncio.Event()
    extend = claims.extend

    async def late(held: Any) -> Any:
        entered.set()
        await written.wait()
        return await extend(held)

    claims.extend = late  # type: ignore[method-assign]
    lost = metrics.sample_total(metrics.CLAIMS_LOST)
    writer = asyncio.create_task(completer.run())
    try:
        beat = asyncio.create_task(completer.extend_leases())
        await asyncio.wait_for(entered.wait(), 10)
        completer.put(outcomes.delivered(msg, status_code=200))
        assert await completer.flush(10)
        written.set()
        assert await asyncio.wait_for(beat, 10) == 0
    finally:
        writer.cancel()
    assert metrics.sample_total(metrics.CLAIMS_LOST) == lost
    assert row(engine, msg.id).status == "delivered"


async def test_claims_slow_down_to_what_the_completer_writes(engine: Engine, aengine: Any) -> None:
    """Outcomes waiting beyond one batch count against the room to claim: a completer
    that falls behind (a slow or absent database) stops the claims, rather than the
    poller holding ever more delivered, unwritten rows."""
    from poller.complete.completer import Completer
    from poller.deliver.dispatcher import Dispatcher, EndpointCache
    from poller.rows.claims import Claims
    from poller.rules import outcomes

    make_endpoint(engine, "a", url="http://127.0.0.1:9/")
    seed(engine, 5, "a")
    claims = Claims(aengine, poller_id="p1", claim_lease=30)
    batch = await claims.claim(10)
    completer = Completer(claims, batch_limit=2)
    settings = fast_settings(concurrency=8)
    no_sender: Any = None  # nothing is delivered here
    dispatcher = Dispatcher(settings, no_sender, EndpointCache(), completer)
    assert dispatcher.room == 8
    for msg in batch.messages:
        completer.hold(msg)
        completer.put(outcomes.delivered(msg, status_code=200))
    assert dispatcher.room == 8 - (5 - 2)
    writer = asyncio.create_task(completer.run())
    try:
        assert await completer.flush(10)
    finally:
        writer.cancel()
    assert dispatcher.room == 8
