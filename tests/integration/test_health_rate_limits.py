"""Endpoint health (poller/rules/health.py): whole-endpoint pauses after 429/503 + Retry-After,
and rate limits — tokens, not messages, across pollers, taken in turn."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from poller import Message, enqueue_many
from poller.endpoints.registry import update_endpoint
from poller.local.receiver import Faults
from poller.rows.claims import Claims
from poller.rules import outcomes
from poller.rules.health import MIN_RATE
from tests.conftest import make_endpoint
from tests.integration.health_helpers import (
    age_first_hundred,
    claim,
    claim_within,
    dataclass_replace,
    ending_gaps,
    health,
)
from tests.integration.helpers import seed, wait_for
from tests.integration.service_helpers import (
    counts,
    fast_settings,
    running_poller,
    running_receiver,
)


async def test_retry_after_pauses_the_whole_endpoint(engine: Engine, breaker: Claims) -> None:
    make_endpoint(engine, "billing", max_attempts=10)
    make_endpoint(engine, "other", max_attempts=10)
    seed(engine, 5)
    first = await claim(breaker, 1)
    seed(engine, 3, endpoint="other")
    throttled = outcomes.retry(first[0], 0.0, status_code=429, error_message="HTTP 429")
    await breaker.complete([dataclass_replace(throttled, pause=0.5)])
    assert health(engine).paused_until is not None
    batch = await claim(breaker)
    assert {m.endpoint_id for m in batch} == {health(engine, "other").endpoint_id}
    rest = await claim_within(breaker)  # once the pause is over
    assert len(rest) == 5 and all(not m.probe for m in rest)


async def test_a_rate_limit_hands_out_tokens_not_messages(engine: Engine, breaker: Claims) -> None:
    make_endpoint(engine, "billing", max_attempts=10)
    with engine.begin() as conn:
        conn.execute(text("UPDATE poller_endpoints SET rate_limit = 20, rate_burst = 4"))
        conn.execute(text("UPDATE poller_endpoint_health SET tokens_at = now() - interval '1 h'"))
    seed(engine, 40)
    assert await breaker.claim_batch(limit=100) == []  # the plain claim leaves it alone
    began = time.monotonic()
    first = await claim(breaker)
    assert len(first) == 4  # the burst
    got = len(first)
    while got < 14:
        got += len(await claim(breaker))
    elapsed = time.monotonic() - began
    assert elapsed >= 10 / 20 * 0.9, elapsed  # 10 more tokens at 20/s: half a second


async def test_a_governed_claim_writes_only_the_health_rows_it_takes_from(
    engine: Engine, breaker: Claims
) -> None:
    """Two rate-limited endpoints with messages, one with no token: the claim takes
    from the other and leaves the first's health row unwritten (every governed
    endpoint's was written, every governed claim), and says governed work is due
    while its messages wait for a token; with nothing due, that none is."""
    billing = make_endpoint(engine, "billing", max_attempts=10).endpoint
    make_endpoint(engine, "spent", max_attempts=10)
    with engine.begin() as conn:
        conn.execute(text("UPDATE poller_endpoints SET rate_limit = 0.001, rate_burst = 1"))
        conn.execute(
            text(
                "UPDATE poller_endpoint_health SET tokens_at = now(), "
                "tokens = CASE WHEN endpoint_id = :id THEN 1 ELSE 0 END"
            ),
            {"id": billing.id},
        )
    seed(engine, 2)
    seed(engine, 2, endpoint="spent")
    version = text(
        "SELECT CAST(h.xmin AS text) FROM poller_endpoint_health h "
        "JOIN poller_endpoints e ON e.id = h.endpoint_id WHERE e.name = 'spent'"
    )
    with engine.connect() as conn:
        before = conn.execute(version).scalar_one()
    (taken,) = await claim(breaker)
    assert taken.endpoint_id == billing.id
    with engine.connect() as conn:
        assert conn.execute(version).scalar_one() == before
    waiting = await breaker.claim(100, governed=True)
    assert waiting.messages == [] and waiting.governed
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM poller_outbox WHERE status = 'pending'"))
    assert (await breaker.claim(100, governed=True)).governed == 0


async def test_rate_limited_endpoints_are_taken_in_turn(engine: Engine, breaker: Claims) -> None:
    """Three rate-limited endpoints whose bursts refill between claims, claims of 10:
    each claim takes from the next endpoint, by (bucket, endpoint). The next claim
    started after the last endpoint found, and the first, its burst refilled, took
    every claim."""
    names = ["a", "b", "c"]
    made = [
        make_endpoint(engine, n, max_attempts=10, rate_limit=1_000_000.0, rate_burst=10).endpoint
        for n in names
    ]
    ids = [e.id for e in sorted(made, key=lambda e: (e.bucket, e.id))]
    for n in names:
        seed(engine, 30, endpoint=n)
    taken = [{m.endpoint_id for m in await claim(breaker, 10)} for _ in range(4)]
    assert taken == [{ids[0]}, {ids[1]}, {ids[2]}, {ids[0]}]


async def test_a_governed_claim_of_nothing_keeps_the_walks_place(
    engine: Engine, breaker: Claims
) -> None:
    """A claim with no room (limit 0) takes nothing and leaves the next one its place:
    it returned no place, and every governed claim after walked nothing."""
    make_endpoint(engine, "billing", max_attempts=10, rate_limit=100.0)
    seed(engine, 2)
    assert (await breaker.claim(0, governed=True)).messages == []
    assert len(await claim_within(breaker)) == 2


async def test_a_backlog_aged_out_behind_a_rate_limit_spends_no_tokens(
    engine: Engine, breaker: Claims
) -> None:
    """Messages past max_age at the head of a rate-limited endpoint's backlog are claimed
    many at a time, flagged expired, and spend no token: the tokens go to the rest (here
    to one that needs a lookup, a request). Each took a token: a backlog larger than the
    rate times max_age failed at the rate, and the messages behind it aged out in turn."""
    make_endpoint(engine, "billing", max_attempts=10, max_age=60.0)
    with engine.begin() as conn:  # one token, the next in 1,000 s
        conn.execute(text("UPDATE poller_endpoints SET rate_limit = 0.001, rate_burst = 1"))
        conn.execute(text("UPDATE poller_endpoint_health SET tokens_at = now() - interval '1 h'"))
    seed(engine, 103)
    age_first_hundred(engine)  # 100 aged out, 2 of them to be looked up; 3 fresh
    batch = await claim(breaker)
    aged = [m for m in batch if m.expired]
    assert len(aged) == 98 and not any(m.probe or m.needs_lookup for m in aged)
    (sent,) = [m for m in batch if not m.expired]
    assert sent.needs_lookup  # the token's message: the head's first that needs a request
    assert await claim(breaker) == []  # the one token is spent, the fresh ones wait


async def test_a_rate_limit_holds_across_two_pollers(engine: Engine, db_url: str) -> None:
    """200 requests per second, two pollers claiming every shard (no election): the
    receiver sees 200/s within 10 % over 5 s, and both pollers took part. The burst is
    a fifth of a second's tokens: with a tenth's, a loaded machine that made the governed
    claims come later than ten a second lost tokens at the cap (152/s in a fresh
    clone's run), which is the machine, not the limit."""
    async with running_receiver() as (receiver, url):
        make_endpoint(engine, "billing", url=url, max_attempts=10)
        with Session(engine) as session, session.begin():
            update_endpoint(session, "billing", rate_limit=200, rate_burst=40)
        seed(engine, 1500)
        settings = fast_settings(election="none")
        async with (
            running_poller(db_url, settings, "p1") as p1,
            running_poller(db_url, settings, "p2") as p2,
        ):
            took = {"p1": 0, "p2": 0}
            p1.claimer.on_cycle.append(lambda n: took.__setitem__("p1", took["p1"] + n))
            p2.claimer.on_cycle.append(lambda n: took.__setitem__("p2", took["p2"] + n))

            async def started() -> bool:
                return receiver.stats.received > 60  # past the burst

            await wait_for(started, timeout=10)
            first = receiver.stats.received
            await asyncio.sleep(5)  # the measurement window itself, not a synchronisation
            rate = (receiver.stats.received - first) / 5
    assert 180 <= rate <= 220, rate
    assert took["p1"] > 0 and took["p2"] > 0, took


async def test_the_slowest_rate_limit_claims_and_the_database_refuses_a_slower_one(
    engine: Engine, breaker: Claims
) -> None:
    make_endpoint(engine, "billing")
    with Session(engine) as session, session.begin():
        update_endpoint(session, "billing", rate_limit=MIN_RATE, rate_burst=1)
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE poller_endpoint_health SET tokens_at = now() - interval '2 days'")
        )
    seed(engine, 3)
    assert len(await claim(breaker)) == 1  # its one token
    assert await claim(breaker) == []  # and no underflow in the bucket's arithmetic
    with pytest.raises(IntegrityError, match="rate_limit_positive"), engine.begin() as conn:
        conn.execute(text("UPDATE poller_endpoints SET rate_limit = 5e-324"))


async def test_an_idle_rate_limited_endpoint_is_not_walked_ten_times_a_second(
    engine: Engine, db_url: str
) -> None:
    """A busy poller that knows a rate-limited endpoint with nothing due makes the
    governed claim about once a second, not ten times (each walked every idle
    rate-limited endpoint: 1,000 of them, 11 ms of PostgreSQL a claim); a message
    for that endpoint's bucket, NOTIFYed, is counted for the next governed claim,
    and goes."""

    def enqueue(endpoint: str, key: str) -> None:
        with Session(engine) as session, session.begin():
            enqueue_many(session, [Message(endpoint, "test.event", {"k": key}, key)])

    def delivered(n: int) -> Callable[[], Awaitable[bool]]:
        async def check() -> bool:
            return counts(engine).get("delivered", 0) == n

        return check

    async with running_receiver() as (_, url):
        make_endpoint(engine, "limited", url=url, max_attempts=3, rate_limit=1000.0)
        make_endpoint(engine, "plain", url=url, max_attempts=3)
        async with running_poller(db_url, fast_settings()) as poller:
            governed = 0
            claim = poller.claims.claim

            async def counted(*args: Any, **options: Any) -> Any:
                nonlocal governed
                governed += bool(options.get("governed"))
                return await claim(*args, **options)

            poller.claims.claim = counted  # type: ignore[method-assign]
            enqueue("limited", "limited:0")  # known to the poller once delivered
            await wait_for(delivered(1), timeout=10)
            assert poller.claimer.endpoints.rate_limited
            # 1.5 s of plain messages, one every 20 ms: each NOTIFYed, each a claim
            began, governed = time.monotonic(), 0
            for i in range(75):
                enqueue("plain", f"plain:{i}")
                await asyncio.sleep(0.02)  # the feed's pace, not a wait for the poller
            took = time.monotonic() - began
            assert governed <= took + 2, (governed, took)  # ten a second: about 15
            notes = poller.claimer._limited_notes
            enqueue("limited", "limited:1")
            await wait_for(delivered(77), timeout=10)
            assert poller.claimer._limited_notes > notes  # its bucket's NOTIFY counted


async def test_a_rate_limited_keys_next_message_goes_when_the_one_before_has_ended(
    engine: Engine, db_url: str
) -> None:
    """An ordering key on a rate-limited endpoint whose receiver takes 0.15 s: a key's
    next message is due once the one before has ended, with no NOTIFY, and only a
    governed claim takes it. The governed claim comes at once after such an outcome
    (or a handed-back message) is written; at the idle cadence each waited up to a
    second. Judged by the median time between two deliveries (about 0.25 s; 1 s at the
    idle cadence)."""
    async with running_receiver(Faults(latency=0.15)) as (_, url):
        make_endpoint(engine, "billing", url=url, max_attempts=3, rate_limit=1000.0)
        seed(engine, 6, ordering_key="k")
        async with running_poller(db_url, fast_settings()):

            async def delivered() -> bool:
                return counts(engine).get("delivered", 0) == 6

            await wait_for(delivered, timeout=20, interval=0.05)
    gaps = ending_gaps(engine)
    assert gaps[len(gaps) // 2] < 0.6, gaps
