"""Endpoint health (poller/rules/health.py): the circuit breaker — failed sends open it, probes
test it, a backlog ages out behind it — and auto-disable."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.orm import Session

from poller import Message, enqueue_many
from poller.endpoints.registry import set_enabled
from poller.local.receiver import Faults
from poller.rows.claims import Claims
from poller.rows.events import (
    ENDPOINT_DISABLED,
    OperationalEvent,
)
from poller.rules import outcomes
from poller.rules.health import HealthPolicy
from poller.store.schema import CIRCUIT_HOLD as HOLD
from tests.conftest import make_endpoint
from tests.integration.health_helpers import (
    age_first_hundred,
    attempts_spent,
    claim,
    claim_within,
    ending_gaps,
    failing,
    health,
)
from tests.integration.helpers import seed, wait_for
from tests.integration.service_helpers import (
    counts,
    fast_settings,
    running_poller,
    running_receiver,
)


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
    age_first_hundred(engine)  # 100 aged out, 2 of them to be looked up; 50 fresh
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
