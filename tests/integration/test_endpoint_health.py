"""Endpoint health (poller/health.py): the circuit breaker, whole-endpoint pauses after
429/503 + Retry-After, rate limits across pollers, auto-disable, operational events."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import Engine, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.orm import Session

from poller import Message, enqueue_many, outcomes
from poller.claims import Claims
from poller.cli import cli
from poller.endpoints import new_secret, set_enabled, update_endpoint
from poller.errors import ConfigurationError, InvalidEndpoint
from poller.events import (
    CIRCUIT_CLOSED,
    CIRCUIT_OPENED,
    ENDPOINT_DISABLED,
    MESSAGE_FAILED,
    EventSink,
    OperationalEvent,
)
from poller.health import MIN_COOLDOWN, MIN_RATE, HealthPolicy
from poller.outcomes import ClaimedMessage
from poller.receiver import Faults, Receiver
from poller.schema import CIRCUIT_HOLD as HOLD
from tests.conftest import make_endpoint
from tests.integration.helpers import seed, wait_for
from tests.integration.service_helpers import (
    counts,
    fast_settings,
    running_poller,
    running_receiver,
)


def health(engine: Engine, name: str = "billing") -> Any:
    with engine.connect() as conn:
        return conn.execute(
            text(
                "SELECT h.*, e.paused_until, e.enabled, e.disabled_reason "
                "FROM poller_endpoint_health h "
                "JOIN poller_endpoints e ON e.id = h.endpoint_id WHERE e.name = :n"
            ),
            {"n": name},
        ).one()


def attempts_spent(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT sum(attempts) FROM poller_outbox")).scalar_one())


def ending_gaps(engine: Engine) -> list[float]:
    """The seconds between one message's last write and the next's, sorted (the median
    judges a pace: a loaded machine's stalls move it less than a run's whole time)."""
    with engine.connect() as conn:
        ended = conn.execute(
            text("SELECT extract(epoch FROM updated_at) FROM poller_outbox ORDER BY 1")
        ).scalars()
        times = [float(t) for t in ended]
    return sorted(b - a for a, b in itertools.pairwise(times))


@pytest.fixture
def breaker(aengine: AsyncEngine) -> Claims:
    policy = HealthPolicy(circuit_failures=3, circuit_cooldown=0.3, circuit_cooldown_max=0.6)
    return Claims(aengine, poller_id="p1", claim_lease=30, health=policy)


def failing(msg: ClaimedMessage, status: int | None = 500) -> outcomes.Outcome:
    error_class = None if status else "ConnectError"
    return outcomes.retry(msg, 0, status_code=status, error_class=error_class, error_message="down")


async def claim(breaker: Claims, limit: int = 100) -> list[ClaimedMessage]:
    return await breaker.claim_batch(limit=limit, governed=True)


async def claim_within(breaker: Claims, seconds: float = 5.0) -> list[ClaimedMessage]:
    deadline = time.monotonic() + seconds
    while not (batch := await claim(breaker)):
        assert time.monotonic() < deadline, "nothing became claimable"
    return batch


async def test_failed_sends_open_the_circuit_and_a_probe_closes_it(
    engine: Engine, breaker: Claims
) -> None:
    make_endpoint(engine, "billing", max_attempts=10)
    seed(engine, 10)
    first = await claim(breaker, 2)
    await breaker.complete([failing(m) for m in first])
    assert (health(engine).state, health(engine).consecutive_failures) == ("closed", 2)
    second = await claim(breaker, 1)
    await breaker.complete([failing(m, None) for m in second])  # no answer: counts too
    opened = health(engine)
    assert (opened.state, opened.opens, opened.cooldown) == ("open", 1, 0.3)
    assert opened.paused_until is not None and opened.last_error == "ConnectError"

    spent = attempts_spent(engine)
    assert await claim(breaker) == []  # open: nothing claimed, nothing spent
    assert attempts_spent(engine) == spent

    probe = await claim_within(breaker)
    assert [m.probe for m in probe] == [True]  # one message: the probe
    assert health(engine).state == "half_open" and health(engine).probes == 1
    assert await claim(breaker) == []
    await breaker.complete([outcomes.probe_failed(probe[0], failing(probe[0], 503))])
    reopened = health(engine)
    assert (reopened.state, reopened.opens, reopened.cooldown) == ("open", 1, 0.6)  # doubled
    assert attempts_spent(engine) == spent  # the probe's attempt was handed back

    probe = await claim_within(breaker)
    await breaker.complete([outcomes.delivered(probe[0], status_code=200)])
    closed = health(engine)
    assert (closed.state, closed.consecutive_failures, closed.cooldown) == ("closed", 0, None)
    assert closed.paused_until is None and closed.failing_since is None
    assert len(await claim(breaker)) == 9  # the backlog drains, the retried ones too


async def test_every_failed_send_counts_on_a_last_attempt_and_a_probe_too(
    engine: Engine, aengine: AsyncEngine
) -> None:
    """max_attempts 1: each message fails for good on its one send, and each send still
    counts — the circuit opens, a failed probe (also a last attempt) reopens it with a
    doubled cool-down, and failing past disable_after disables the endpoint."""
    make_endpoint(engine, "billing", max_attempts=1, max_in_flight=1)
    seed(engine, 10)
    policy = HealthPolicy(circuit_failures=3, circuit_cooldown=0.2, disable_after=0.5)
    claims = Claims(aengine, poller_id="p1", claim_lease=30, health=policy)
    for _ in range(3):
        (msg,) = await claim(claims)
        await claims.complete([failing(msg)])
    assert (health(engine).state, counts(engine)["failed"]) == ("open", 3)
    (probe,) = await claim_within(claims)
    assert probe.probe and probe.last_attempt
    await claims.complete([outcomes.probe_failed(probe, failing(probe))])
    assert (health(engine).state, health(engine).cooldown) == ("open", 0.4)
    assert health(engine).enabled  # failing for less than disable_after yet
    with engine.begin() as conn:  # disable_after is a span: it has passed
        conn.execute(
            text("UPDATE poller_endpoint_health SET failing_since = now() - interval '1s'")
        )
    (probe,) = await claim_within(claims)
    await claims.complete([outcomes.probe_failed(probe, failing(probe, None))])
    assert not health(engine).enabled
    assert "failing since" in health(engine).disabled_reason


async def test_an_operator_holding_the_endpoint_never_makes_a_completion_wait(
    engine: Engine, breaker: Claims
) -> None:
    """An operator's transaction holds the endpoint's row (an edit under way): failed
    sends complete at once, their count waits in the backlog, and the sweep folds it
    in once the row is free — counted once, opening the circuit."""
    make_endpoint(engine, "billing", max_attempts=5)
    seed(engine, 3)
    batch = await claim(breaker)
    with engine.begin() as operator:
        operator.execute(text("SELECT 1 FROM poller_endpoints FOR UPDATE"))
        async with asyncio.timeout(5):
            result = await breaker.complete([failing(m) for m in batch])
        assert len(result.applied) == 3
        assert health(engine).failed_requests == 0
    assert await breaker.completions.sweep_follow_ups() == 0  # the sweep: folds the backlog in
    folded = health(engine)
    assert (folded.failed_requests, folded.state) == (3, "open")
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM poller_health_backlog")).scalar() == 0


@pytest.mark.parametrize("end", ["handed back unsent", "answered 400", "expired"])
async def test_a_probe_that_ends_without_a_verdict_is_followed_by_the_next_at_once(
    engine: Engine, breaker: Claims, end: str
) -> None:
    """A probe handed back (a graceful shutdown), answered with a 4xx that is not a
    failure, or older than its endpoint's max_age neither closes nor reopens the
    circuit. The next probe goes once nothing of the endpoint is in flight: it waited two
    claim leases (here 60 s; by default 120), each expired message of a backlog again."""
    make_endpoint(engine, "billing", max_attempts=10)
    seed(engine, 5)
    await breaker.complete([failing(m) for m in await claim(breaker, 3)])
    (probe,) = await claim_within(breaker)
    assert probe.probe and health(engine).state == "half_open"
    if end == "handed back unsent":
        await breaker.complete([outcomes.released(probe)])
    elif end == "answered 400":
        await breaker.complete([outcomes.retry(probe, 0, status_code=400, error_message="no")])
    else:
        await breaker.complete([outcomes.expired(probe, 60.0, 61.0)])
    assert health(engine).state == "half_open"  # no verdict either way
    (second,) = await claim_within(breaker, 2.0)
    assert second.probe and health(engine).probes == 2
    assert await claim(breaker) == []  # one probe at a time
    await breaker.complete([outcomes.delivered(second, status_code=200)])
    assert health(engine).state == "closed"


async def test_a_backlog_aged_out_behind_an_open_circuit_ends_in_bulk_with_a_probe(
    engine: Engine, breaker: Claims
) -> None:
    """Messages older than the endpoint's max_age at the head of an open circuit's
    backlog are claimed many at a time, flagged expired and not probes (no token), and
    failed unsent; the probe goes in the same claim. They went one per governed claim:
    10,000 took 17 minutes before a real probe could close the circuit. Then the probe
    waited until none was left at the head, and a steady feed (messages crossing
    max_age between any two claims) kept it from going at all: 20 governed claims took
    60 aged messages and sent no probe. Ones that need a lookup first stay for the
    probe (a lookup is a request)."""
    make_endpoint(engine, "billing", max_attempts=10, max_age=60.0)
    seed(engine, 153)
    await breaker.complete([failing(m) for m in await claim(breaker, 3)])
    with engine.begin() as conn:  # 100 aged out, 2 of them to be looked up; 50 fresh
        conn.execute(
            text(
                "UPDATE poller_outbox SET created_at = created_at - interval '1 hour', "
                "next_attempt_at = now() - interval '1 hour', "
                "needs_lookup = (id % 50 = 0) "
                "WHERE id IN (SELECT id FROM poller_outbox ORDER BY id LIMIT 100)"
            )
        )
    batch = await claim_within(breaker)
    aged = [m for m in batch if m.expired]
    assert len(aged) == 98 and not any(m.probe for m in aged)
    (probe,) = [m for m in batch if not m.expired]
    assert probe.probe and probe.needs_lookup
    assert (health(engine).state, health(engine).probes) == ("half_open", 1)


async def test_a_probe_is_never_a_message_past_max_age(engine: Engine, breaker: Claims) -> None:
    """More messages past max_age than a claim takes: the claim takes its fill of them
    and no probe (the first due message not among them was past max_age too: counted as
    a probe and failed unsent); once fewer are left, a fresh one is the probe."""
    make_endpoint(engine, "billing", max_attempts=10, max_age=60.0)
    seed(engine, 8)
    await breaker.complete([failing(m) for m in await claim(breaker, 3)])  # opens it
    with engine.begin() as conn:  # 5 aged out, 3 fresh
        conn.execute(
            text(
                "UPDATE poller_outbox SET created_at = created_at - interval '1 hour', "
                "next_attempt_at = now() - interval '1 hour' "
                "WHERE id IN (SELECT id FROM poller_outbox ORDER BY id LIMIT 5)"
            )
        )
    deadline = time.monotonic() + 5
    while not (batch := await breaker.claim_batch(limit=3, governed=True)):
        assert time.monotonic() < deadline, "nothing became claimable"
    assert [m.expired for m in batch] == [True] * 3 and health(engine).probes == 0
    (probe, *aged) = await breaker.claim_batch(limit=3, governed=True)
    assert probe.probe and not probe.expired and [m.expired for m in aged] == [True, True]


async def test_an_ordered_key_aged_out_behind_an_open_circuit_ends_at_the_pace_of_its_writes(
    engine: Engine, db_url: str
) -> None:
    """40 messages on one ordering key, all past max_age, behind an open circuit on a
    ``skip`` endpoint: each is due only once the one before has failed. The claim the
    hand-over wakes is a governed one, so they go as fast as their outcomes are
    written; at ten governed claims a second they took 4 s (and no probe could go,
    nothing else being due). Judged by the median time between two of them failing
    (0.1 s at that pace, about 0.01 s now), which a loaded machine's stalls move less
    than the whole run's time (0.4-0.5 s, 3.0 s on a machine running four
    benchmarks beside the suite)."""
    make_endpoint(engine, "billing", max_age=60.0, on_failed_head="skip")
    seed(engine, 40, ordering_key="k")
    with engine.begin() as conn:
        conn.execute(text("UPDATE poller_outbox SET created_at = now() - interval '1 hour'"))
        conn.execute(text("UPDATE poller_endpoint_health SET state = 'open', open_until = now()"))
        conn.execute(text("UPDATE poller_endpoints SET paused_until = :hold"), {"hold": HOLD})
    async with running_poller(db_url, fast_settings()):
        began = time.monotonic()

        async def failed() -> bool:
            return counts(engine).get("failed", 0) == 40

        await wait_for(failed, timeout=20, interval=0.05)
        took = time.monotonic() - began
    gaps = ending_gaps(engine)
    assert gaps[len(gaps) // 2] < 0.05, (took, gaps)
    assert health(engine).probes == 0  # every message past max_age: none was a probe


@pytest.mark.parametrize("max_age", ["1e308", "Infinity", "NaN"])
async def test_an_age_limit_no_interval_can_hold_leaves_the_probe_alone(
    engine: Engine, breaker: Claims, max_age: str
) -> None:
    """max_age written past what the API allows (its check only wants it positive): the
    governed claim must still claim, not fail on an interval out of range."""
    make_endpoint(engine, "billing", max_attempts=10)
    seed(engine, 4)
    await breaker.complete([failing(m) for m in await claim(breaker, 3)])
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE poller_endpoints SET max_age = CAST(:a AS float8)"), {"a": max_age}
        )
    (probe,) = await claim_within(breaker)
    assert probe.probe and not probe.expired


async def test_a_probe_that_looks_up_first_is_a_probe_too(engine: Engine, db_url: str) -> None:
    """The probe's message had an unknown outcome, so the probe is a lookup; the lookup
    answers 500: the circuit opens again (cool-down doubled) and no attempt is spent."""
    from tests.integration.servers import answer, raw_server

    async with raw_server(answer(500)) as base:
        lookup = f"{base}/w/{{idempotency_key}}"
        make_endpoint(engine, "billing", url=f"{base}/hook", lookup_url=lookup, max_attempts=3)
        seed(engine, 1)
        with engine.begin() as conn:
            conn.execute(text("UPDATE poller_outbox SET needs_lookup = true, attempts = 1"))
            conn.execute(
                text(
                    "UPDATE poller_endpoint_health SET state = 'open', cooldown = 0.2, "
                    "open_until = now(), consecutive_failures = 3"
                )
            )
            conn.execute(text("UPDATE poller_endpoints SET paused_until = '9000-01-01 UTC'"))
        settings = fast_settings(circuit_failures=3, circuit_cooldown=0.2, circuit_cooldown_max=5)
        async with running_poller(db_url, settings):

            async def reopened() -> bool:
                return health(engine).probes >= 1 and health(engine).state == "open"

            await wait_for(reopened, timeout=10)
    assert health(engine).cooldown == 0.4 and health(engine).failed_requests >= 1
    assert attempts_spent(engine) == 1  # the probe's lookup handed its attempt back


async def test_a_failed_probe_hands_its_attempt_back_a_bounded_number_of_times(
    engine: Engine, breaker: Claims
) -> None:
    make_endpoint(engine, "billing", max_attempts=1)
    seed(engine, 1)
    with engine.begin() as conn:
        conn.execute(
            text(f"UPDATE poller_outbox SET probe_refunds = {outcomes.MAX_PROBE_REFUNDS - 1}")
        )
        conn.execute(text("UPDATE poller_endpoint_health SET state = 'open', open_until = now()"))
    (probe,) = await claim(breaker)
    await breaker.complete([outcomes.probe_failed(probe, failing(probe))])
    assert counts(engine) == {"pending": 1}  # handed back: the last refund allowed
    with engine.begin() as conn:
        conn.execute(text("UPDATE poller_endpoint_health SET open_until = now()"))
    (probe,) = await claim_within(breaker)
    assert probe.probe_refunds == outcomes.MAX_PROBE_REFUNDS
    await breaker.complete([outcomes.probe_failed(probe, failing(probe))])
    assert counts(engine) == {"failed": 1}  # charged: its one attempt is spent


async def test_a_4xx_answer_is_not_a_failed_endpoint(engine: Engine, breaker: Claims) -> None:
    make_endpoint(engine, "billing", max_attempts=10)
    seed(engine, 5)
    batch = await claim(breaker, 5)
    await breaker.complete([outcomes.failed(m, status_code=400) for m in batch])
    assert (health(engine).state, health(engine).consecutive_failures) == ("closed", 0)


async def test_the_breaker_off_never_opens_but_an_endpoint_can_override_it(
    engine: Engine, aengine: AsyncEngine
) -> None:
    off = Claims(aengine, poller_id="p1", claim_lease=30, health=HealthPolicy(circuit_failures=0))
    make_endpoint(engine, "billing", max_attempts=10)
    make_endpoint(engine, "strict", max_attempts=10)
    with engine.begin() as conn:
        conn.execute(text("UPDATE poller_endpoints SET circuit_failures = 2 WHERE name = 'strict'"))
    seed(engine, 30)
    seed(engine, 2, endpoint="strict")
    batch = await off.claim_batch(limit=100)
    await off.complete([failing(m) for m in batch])
    assert (health(engine).state, health(engine).consecutive_failures) == ("closed", 30)
    assert health(engine, "strict").state == "open"


async def test_a_success_in_the_same_batch_keeps_the_circuit_closed(
    engine: Engine, breaker: Claims
) -> None:
    make_endpoint(engine, "billing", max_attempts=10)
    seed(engine, 6)
    batch = await claim(breaker, 6)
    written = [failing(m) for m in batch[:5]] + [outcomes.delivered(batch[5], status_code=200)]
    await breaker.complete(written)
    assert (health(engine).state, health(engine).consecutive_failures) == ("closed", 0)


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


def dataclass_replace(outcome: outcomes.Outcome, **changes: Any) -> outcomes.Outcome:
    import dataclasses

    return dataclasses.replace(outcome, **changes)


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
    with engine.begin() as conn:  # 100 aged out, 2 of them to be looked up; 3 fresh
        conn.execute(
            text(
                "UPDATE poller_outbox SET created_at = created_at - interval '1 hour', "
                "next_attempt_at = now() - interval '1 hour', "
                "needs_lookup = (id % 50 = 0) "
                "WHERE id IN (SELECT id FROM poller_outbox ORDER BY id LIMIT 100)"
            )
        )
    batch = await claim(breaker)
    aged = [m for m in batch if m.expired]
    assert len(aged) == 98 and not any(m.probe or m.needs_lookup for m in aged)
    (sent,) = [m for m in batch if not m.expired]
    assert sent.needs_lookup  # the token's message: the head's first that needs a request
    assert await claim(breaker) == []  # the one token is spent, the fresh ones wait


# --- operational events, at the claims level ---------------------------------------


async def test_events_never_report_on_the_operator_endpoint_itself(
    engine: Engine, aengine: AsyncEngine
) -> None:
    """Its own failures would otherwise enqueue events to itself, which fail, and so on."""
    policy = HealthPolicy(circuit_failures=2)
    sink = EventSink("billing")
    own = Claims(aengine, poller_id="p1", claim_lease=30, health=policy, events=sink)
    make_endpoint(engine, "billing", max_attempts=1)
    seed(engine, 3)
    batch = await own.claim_batch(limit=10)
    result = await own.complete([failing(m) for m in batch])
    assert health(engine).state == "open" and len(result.applied) == 3
    assert result.events == [] and sink.published == 0
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM poller_outbox")).scalar_one() == 3


async def test_a_missing_operator_endpoint_loses_no_completion(
    engine: Engine, aengine: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    sink = EventSink("removed-since")
    own = Claims(aengine, poller_id="p1", claim_lease=30, events=sink)
    make_endpoint(engine, "billing", max_attempts=1)
    seed(engine, 2)
    batch = await own.claim_batch(limit=10)
    result = await own.complete([failing(m) for m in batch])
    assert len(result.applied) == 2 and [e.type for e in result.events] == [MESSAGE_FAILED] * 2
    assert counts(engine) == {"failed": 2} and sink.published == 0
    assert "POLLER_OPERATOR_ENDPOINT=removed-since" in caplog.text


# --- the service ---------------------------------------------------------------------


class Recording(Receiver):
    """A receiver that keeps every applied body (operational events)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.bodies: list[dict[str, Any]] = []

    def _apply(
        self, key: str, body: bytes, now: float, headers: dict[bytes, bytes] | None = None
    ) -> None:
        if key not in self.applied:
            self.bodies.append(json.loads(body))
        super()._apply(key, body, now, headers)


@contextlib.asynccontextmanager
async def recording(secret: str) -> AsyncIterator[tuple[Recording, str]]:
    receiver = Recording(keys=[secret])
    port = await receiver.start()
    try:
        yield receiver, f"http://127.0.0.1:{port}"
    finally:
        await receiver.stop()


async def test_a_down_endpoint_gets_a_handful_of_probes_not_thousands(
    engine: Engine, db_url: str
) -> None:
    """5,000 messages to an endpoint that is down, then back: while down the receiver
    sees the sends that opened the circuit and a few probes, no message spends an
    attempt while the circuit is open, and all 5,000 are delivered after."""
    faults = Faults(fail_rate=1.0, status=503)
    async with running_receiver(faults) as (receiver, url):
        make_endpoint(engine, "billing", url=url, max_attempts=10, max_in_flight=8)
        seed(engine, 5000)
        settings = fast_settings(circuit_failures=5, circuit_cooldown=0.2, circuit_cooldown_max=0.4)
        async with running_poller(db_url, settings):

            async def probed_thrice() -> bool:
                return health(engine).probes >= 3 and health(engine).state == "open"

            await wait_for(probed_thrice, timeout=20)
            down, probes = receiver.stats.received, health(engine).probes
            # A failed request keeps its slot until its outcome is written: its
            # max_in_flight (8) before the first failures are judged, fewer than 5 more
            # in slots that writes of fewer failures freed, then the probes: not
            # thousands (before slots were held, a loaded host saw up to 92)
            assert down < 8 + 5 + probes, (down, probes)
            assert attempts_spent(engine) == down - probes  # probes handed theirs back
            faults.fail_rate = 0.0  # the endpoint is back

            async def delivered() -> bool:
                return counts(engine).get("delivered", 0) == 5000

            await wait_for(delivered, timeout=90, interval=0.1)
    assert receiver.stats.applied == 5000 and receiver.stats.duplicates == 0
    assert health(engine).state == "closed"


async def test_a_healthy_endpoint_beside_an_open_circuit_keeps_its_rate(
    engine: Engine, db_url: str
) -> None:
    async with (
        running_receiver(Faults(fail_rate=1.0, status=500)) as (down, down_url),
        running_receiver() as (up, up_url),
    ):
        make_endpoint(engine, "broken", url=down_url, max_attempts=10)
        make_endpoint(engine, "billing", url=up_url, max_attempts=10)
        settings = fast_settings(circuit_failures=5, circuit_cooldown=60, circuit_cooldown_max=60)
        async with running_poller(db_url, settings):
            seed(engine, 500)
            began = time.monotonic()

            def drained(n: int) -> Callable[[], Awaitable[bool]]:
                async def check() -> bool:
                    return up.stats.applied >= n

                return check

            await wait_for(drained(500), timeout=30)
            alone = time.monotonic() - began
            seed(engine, 3000, endpoint="broken")

            async def opened() -> bool:
                return health(engine, "broken").state == "open"

            await wait_for(opened, timeout=10)
            at_open = down.stats.received
            with Session(engine) as session, session.begin():
                enqueue_many(
                    session,
                    [Message("billing", "e", {"n": i}, f"more:{i}") for i in range(500)],
                )
            began = time.monotonic()
            await wait_for(drained(1000), timeout=30)
            beside = time.monotonic() - began
    # the broken one opened (5 failed sends, plus the rounds of its 16 in flight claimed
    # before that completion committed: more on a loaded machine), then waited: at most
    # the sends already in flight as it opened, none of the 3,000 after
    assert at_open < 300, at_open
    assert down.stats.received <= at_open + 16, (at_open, down.stats.received)
    assert beside < 2 * alone + 1.0, (alone, beside)


async def test_a_rate_limit_holds_across_two_pollers(engine: Engine, db_url: str) -> None:
    """200 requests per second, two pollers claiming every shard (no election): the
    receiver sees 200/s within 10 % over 5 s, and both pollers took part."""
    async with running_receiver() as (receiver, url):
        make_endpoint(engine, "billing", url=url, max_attempts=10)
        with Session(engine) as session, session.begin():
            update_endpoint(session, "billing", rate_limit=200, rate_burst=20)
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
                return receiver.stats.received > 5  # past the burst

            await wait_for(started, timeout=10)
            first = receiver.stats.received
            await asyncio.sleep(5)  # the measurement window itself, not a synchronisation
            rate = (receiver.stats.received - first) / 5
    assert 180 <= rate <= 220, rate
    assert took["p1"] > 0 and took["p2"] > 0, took


async def test_an_endpoint_failing_too_long_is_disabled_and_enable_drains_it(
    engine: Engine, db_url: str
) -> None:
    faults = Faults(fail_rate=1.0, status=502)
    seen: list[OperationalEvent] = []
    async with running_receiver(faults) as (receiver, url):
        make_endpoint(engine, "billing", url=url, max_attempts=10)
        seed(engine, 20)
        settings = fast_settings(
            circuit_failures=3, circuit_cooldown=0.2, circuit_cooldown_max=0.2, disable_after=1.0
        )
        async with running_poller(db_url, settings, on_event=[seen.append]):

            async def disabled() -> bool:
                return not health(engine).enabled

            await wait_for(disabled, timeout=20)
            reason = health(engine).disabled_reason
            assert reason.startswith("failing since ") and "last error HTTP 502" in reason
            assert counts(engine) == {"pending": 20}  # nothing lost, nothing failed
            faults.fail_rate = 0.0
            with Session(engine) as session, session.begin():
                set_enabled(session, "billing", True)
            assert (health(engine).state, health(engine).consecutive_failures) == ("closed", 0)

            async def delivered() -> bool:
                return counts(engine) == {"delivered": 20}

            await wait_for(delivered, timeout=20)
    assert [e.type for e in seen].count(ENDPOINT_DISABLED) == 1
    assert receiver.stats.applied == 20


async def test_operational_events_arrive_signed_for_exactly_what_happened(
    engine: Engine, db_url: str
) -> None:
    faults = Faults(fail_rate=1.0, status=503)
    hooked: list[OperationalEvent] = []
    async with running_receiver(faults) as (_, url):
        ops_secret = new_secret()
        async with recording(ops_secret) as (ops, ops_url):
            make_endpoint(engine, "ops", url=ops_url, secret=ops_secret)
            make_endpoint(engine, "billing", url=url)
            seed(engine, 3, max_attempts=1)  # these fail for good
            with Session(engine) as session, session.begin():  # this one waits out the circuit
                ids = enqueue_many(session, [Message("billing", "e", {}, "late", max_attempts=5)])
            settings = fast_settings(
                circuit_failures=3,
                circuit_cooldown=0.2,
                circuit_cooldown_max=0.2,
                operator_endpoint="ops",
            )
            async with running_poller(db_url, settings, on_event=[hooked.append]):

                async def reopened() -> bool:
                    return health(engine).probes >= 1 and health(engine).state == "open"

                await wait_for(reopened, timeout=20)
                faults.fail_rate = 0.0

                async def five_events() -> bool:
                    return len(ops.bodies) >= 5 and counts(engine).get("delivered") == 6

                await wait_for(five_events, timeout=20)
    types = sorted(b["type"] for b in ops.bodies)
    assert types == sorted([CIRCUIT_OPENED, CIRCUIT_CLOSED] + [MESSAGE_FAILED] * 3)
    assert sorted(e.type for e in hooked) == types
    assert ops.stats.bad_signatures == 0 and ops.stats.duplicates == 0
    failed = [b for b in ops.bodies if b["type"] == MESSAGE_FAILED]
    assert {b["endpoint"]["name"] for b in ops.bodies} == {"billing"}
    assert ids[0] not in {b["data"]["message_id"] for b in failed}
    assert all(b["data"]["last_status_code"] == 503 for b in failed)
    opened = next(b for b in ops.bodies if b["type"] == CIRCUIT_OPENED)
    assert opened["data"]["last_error"] == "HTTP 503" and "payload" not in json.dumps(opened)


async def test_a_missing_operator_endpoint_stops_the_poller_at_start(db_url: str) -> None:
    with pytest.raises(ConfigurationError, match="POLLER_OPERATOR_ENDPOINT=ops: no such"):
        async with running_poller(db_url, fast_settings(operator_endpoint="ops")):
            pass


# --- the CLI ---------------------------------------------------------------------------


def cli_run(db_url: str, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(
        cli, list(args), env={"POLLER_DATABASE_URL": db_url, "POLLER_ELECTION": "postgres"}
    )
    return result.exit_code, result.output


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--rate-limit", "0"),
        ("--rate-limit", "-5"),
        ("--rate-limit", "nan"),
        ("--rate-limit", "inf"),
        ("--rate-limit", "1e400"),
        ("--rate-limit", "5e-324"),  # its token arithmetic underflowed in every claim
        ("--rate-limit", "fast"),
        ("--rate-burst", "0"),
        ("--rate-burst", "1.5"),
        ("--circuit-failures", "-1"),
        ("--circuit-failures", "99999999999"),
        ("--circuit-cooldown", "0"),
        ("--circuit-cooldown", "NaN"),
        ("--circuit-cooldown", "86401"),
        ("--circuit-cooldown", "5e-324"),  # a failing endpoint probed 10/s for minutes
    ],
)
def test_nasty_health_settings_are_refused_in_one_line(
    db_url: str, engine: Engine, option: str, value: str
) -> None:
    make_endpoint(engine, "billing")
    code, out = cli_run(db_url, "endpoints", "update", "billing", option, value)
    assert code == 2, out
    assert "Traceback" not in out and option in out
    assert health(engine).state == "closed"


def test_nasty_health_settings_are_refused_by_the_api(engine: Engine) -> None:
    make_endpoint(engine, "billing")
    for changes in (
        {"rate_limit": float("nan")},
        {"rate_limit": True},
        {"rate_burst": 2.5},
        {"circuit_failures": -1},
        {"circuit_cooldown": float("inf")},
        {"rate_limit": "50"},
        {"rate_limit": 5e-324},
        {"rate_limit": 0.000009},
        {"circuit_cooldown": 0.049},
    ):
        with Session(engine) as session, pytest.raises(InvalidEndpoint):
            update_endpoint(session, "billing", **changes)
    with Session(engine) as session, session.begin():
        update_endpoint(session, "billing", rate_limit=MIN_RATE)  # the floor: one a day
        update_endpoint(session, "billing", circuit_cooldown=MIN_COOLDOWN)


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


def test_health_settings_and_the_health_command(db_url: str, engine: Engine) -> None:
    make_endpoint(engine, "billing")
    code, out = cli_run(
        db_url,
        "endpoints",
        "update",
        "billing",
        "--rate-limit",
        "50",
        "--rate-burst",
        "10",
        "--circuit-failures",
        "0",
        "--json",
    )
    assert code == 0, out
    shown = json.loads(out)
    assert (shown["rate_limit"], shown["rate_burst"], shown["circuit_failures"]) == (50, 10, 0)
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE poller_endpoint_health SET state = 'open', opened_at = now(), "
                "open_until = now() + interval '30 s', consecutive_failures = 12, "
                "last_error = 'HTTP 503'"
            )
        )
    code, out = cli_run(db_url, "endpoints", "health", "billing", "--json")
    assert code == 0, out
    report = json.loads(out)
    assert report["circuit"] == "open" and report["consecutive_failures"] == 12
    assert report["rate_limit"] == 50 and report["rate_burst"] == 10
    assert report["next_probe_at"] is not None and report["success_ratio_1h"] is None
    code, out = cli_run(db_url, "endpoints", "health")
    assert code == 0 and "circuit open" in out and "HTTP 503" in out, out
    code, out = cli_run(db_url, "admin", "stats", "--json")
    assert json.loads(out)["endpoint_states"] == {}  # no messages: no endpoint rows
    seed(engine, 2)
    code, out = cli_run(db_url, "admin", "stats")
    assert "circuit open" in out and "2 pending messages wait" in out, out
    code, out = cli_run(db_url, "endpoints", "enable", "billing")
    assert code == 0 and health(engine).state == "closed"
    code, out = cli_run(
        db_url, "endpoints", "update", "billing", "--rate-limit", "default", "--json"
    )
    assert json.loads(out)["rate_limit"] is None
    code, out = cli_run(db_url, "endpoints", "health", "nosuch")
    assert code == 1 and "nosuch" in out and "Traceback" not in out


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
