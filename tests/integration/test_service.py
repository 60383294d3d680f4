"""The poller service end to end, in-process, against a real receiver on 127.0.0.1."""

from __future__ import annotations

import asyncio
import time

from prometheus_client import REGISTRY
from sqlalchemy import Engine, select, text
from sqlalchemy.orm import Session

from loadtest.fixtures import insert_due
from poller import enqueue
from poller.endpoints.registry import get_endpoint
from poller.local.receiver import Faults
from poller.store.schema import outbox
from tests.conftest import make_endpoint
from tests.integration.helpers import attempts_of, row, seed, wait_for
from tests.integration.service_helpers import (
    CycleWatch,
    counts,
    fast_settings,
    running_poller,
    running_receiver,
)


def _done(engine: Engine, total: int, status: str = "delivered"):  # type: ignore[no-untyped-def]
    async def check() -> bool:
        return counts(engine).get(status, 0) == total

    return check


async def test_delivers_everything_once(engine: Engine, db_url: str) -> None:
    async with running_receiver() as (receiver, url):
        make_endpoint(engine, "a", url=f"{url}/a")
        make_endpoint(engine, "b", url=f"{url}/b")
        seed(engine, 300, "a")
        seed(engine, 200, "b")
        async with running_poller(db_url, fast_settings()):
            await wait_for(_done(engine, 500), timeout=30)
    assert receiver.stats.applied == 500 and receiver.stats.duplicates == 0
    assert receiver.stats.per_path == {"/a": 300, "/b": 200}


async def test_max_attempts_then_failed_with_last_error(engine: Engine, db_url: str) -> None:
    async with running_receiver(Faults(fail_rate=1.0, status=500)) as (receiver, url):
        make_endpoint(engine, "a", url=url, max_attempts=3)
        (msg_id,) = seed(engine, 1, "a")
        async with running_poller(db_url, fast_settings()):
            await wait_for(_done(engine, 1, "failed"), timeout=20)
    stored = row(engine, msg_id)
    assert (stored.attempts, stored.last_status_code, stored.last_error) == (3, 500, "HTTP 500")
    assert [a.outcome for a in attempts_of(engine, msg_id)] == ["retry", "retry", "failed"]
    assert receiver.stats.received == 3


async def test_410_fails_the_message_and_disables_the_endpoint(engine: Engine, db_url: str) -> None:
    async with running_receiver(Faults(fail_rate=1.0, status=410)) as (receiver, url):
        make_endpoint(engine, "a", url=url)
        (first,) = seed(engine, 1, "a")
        async with running_poller(db_url, fast_settings()) as poller:
            await wait_for(_done(engine, 1, "failed"), timeout=20)
            with engine.connect() as conn:
                assert get_endpoint(conn, "a").enabled is False
            # Messages already queued for a disabled endpoint wait; none is sent.
            with engine.begin() as conn:
                disabled = get_endpoint(conn, "a")
                insert_due(conn, disabled.id, disabled.bucket, 3)
            watch = CycleWatch(poller)
            await watch.wait(3)  # three claim cycles after the rows became due
            assert watch.claimed == 0
    with engine.connect() as conn:
        assert get_endpoint(conn, "a").disabled_reason == "410 Gone from a"
    assert row(engine, first).attempts == 1 and receiver.stats.received == 1


async def test_retry_after_is_honoured(engine: Engine, db_url: str) -> None:
    faults = Faults(fail_rate=1.0, status=503, retry_after="30")
    async with running_receiver(faults) as (_, url):
        make_endpoint(engine, "a", url=url)
        (msg_id,) = seed(engine, 1, "a")
        async with running_poller(db_url, fast_settings()):

            async def retried() -> bool:
                return row(engine, msg_id).last_status_code == 503

            await wait_for(retried, timeout=10)
    stored = row(engine, msg_id)
    delay = (stored.next_attempt_at - stored.updated_at).total_seconds()
    assert 29 <= delay <= 37  # not the 0.05 s schedule (Retry-After jittered 0 to +20 %)


async def test_unknown_then_lookup_finds_it_without_a_resend(engine: Engine, db_url: str) -> None:
    async with running_receiver(Faults(drop_after_process_rate=1.0)) as (receiver, url):
        make_endpoint(engine, "a", url=f"{url}/a", lookup_url=f"{url}/webhooks/{{idempotency_key}}")
        (msg_id,) = seed(engine, 1, "a")
        async with running_poller(db_url, fast_settings()):
            await wait_for(_done(engine, 1), timeout=20)
    assert receiver.stats.received == 1  # exactly one POST
    assert receiver.stats.lookups_found == 1
    kinds = [(a.kind, a.outcome) for a in attempts_of(engine, msg_id)]
    assert kinds == [("send", "unknown"), ("lookup", "delivered")]


async def test_unknown_without_lookup_resends_with_the_same_key(
    engine: Engine, db_url: str
) -> None:
    faults = Faults(drop_after_process_rate=1.0)
    async with running_receiver(faults) as (receiver, url):
        make_endpoint(engine, "a", url=url)
        seed(engine, 1, "a")
        async with running_poller(db_url, fast_settings()):

            async def first_seen() -> bool:
                return receiver.stats.received == 1

            await wait_for(first_seen, timeout=10)
            faults.drop_after_process_rate = 0.0
            await wait_for(_done(engine, 1), timeout=20)
    assert receiver.stats.received == 2
    assert receiver.stats.applied == 1 and receiver.stats.duplicates == 1  # same key twice
    assert list(receiver.applied.values()) == [2]


async def test_notify_wakes_the_poller_well_inside_the_poll_interval(
    engine: Engine, db_url: str
) -> None:
    async with running_receiver() as (_, url):
        make_endpoint(engine, "a", url=url)
        async with running_poller(db_url, fast_settings(poll_interval=10.0)) as poller:
            await wait_for(_idle(poller), timeout=10)  # its first claim cycle ran
            began = time.monotonic()
            with Session(engine) as session, session.begin():
                enqueue(session, endpoint="a", event_type="e", payload={}, idempotency_key="k")
            await wait_for(_done(engine, 1), timeout=5)
            assert time.monotonic() - began < 2.0


def _idle(poller):  # type: ignore[no-untyped-def]
    async def check() -> bool:
        return bool(poller.claimer.cycles >= 1)

    return check


async def test_one_endpoints_backlog_does_not_starve_another(engine: Engine, db_url: str) -> None:
    async with (
        running_receiver(Faults(latency=0.25)) as (_, slow_url),
        running_receiver() as (fast_receiver, fast_url),
    ):
        slow = make_endpoint(engine, "slow", url=slow_url).endpoint
        with engine.begin() as conn:
            insert_due(conn, slow.id, slow.bucket, 50_000)
        make_endpoint(engine, "fast", url=fast_url)
        settings = fast_settings(request_timeout=2.0, claim_lease=10.0)
        async with running_poller(db_url, settings):
            await asyncio.sleep(0.5)  # the slow backlog is being worked on
            seed(engine, 100, "fast")
            began = time.monotonic()

            async def fast_done() -> bool:
                return fast_receiver.stats.applied == 100

            await wait_for(fast_done, timeout=10)
            elapsed = time.monotonic() - began
    assert elapsed < 5, f"fast endpoint waited {elapsed:.1f}s behind the backlog"
    with engine.connect() as conn:
        left = conn.execute(
            select(text("count(*)"))
            .select_from(outbox)
            .where(outbox.c.endpoint_id == slow.id, outbox.c.status == "pending")
        ).scalar_one()
    assert left > 45_000  # the backlog was still there all along


async def test_graceful_stop_releases_without_counting(engine: Engine, db_url: str) -> None:
    async with running_receiver(Faults(latency=5.0)) as (receiver, url):
        make_endpoint(engine, "a", url=url)
        ids = seed(engine, 20, "a")
        settings = fast_settings(  # 8 at once: none waits long enough to make room
            request_timeout=10,
            claim_lease=30,
            shutdown_grace=0.3,
            concurrency=8,
            waiting_after=30,
        )
        async with running_poller(db_url, settings):

            async def sending() -> bool:
                return receiver.stats.received == 8

            await wait_for(sending, timeout=10)
            assert REGISTRY.get_sample_value("webhook_poller_in_flight") == 8  # when scraped
    states = [row(engine, i) for i in ids]
    assert {r.status for r in states} == {"pending"}
    assert {r.attempts for r in states} == {0}  # no attempt wasted
    cut_off = [r for r in states if r.needs_lookup]
    assert len(cut_off) == 8  # sent but unanswered: looked up (or re-sent) next time


async def test_an_endpoint_changed_by_hand_in_sql_is_reloaded_at_once(
    engine: Engine, db_url: str
) -> None:
    """A trigger keeps updated_at current, so the claim notices even a raw UPDATE."""
    async with running_receiver() as (old, old_url), running_receiver() as (new, new_url):
        make_endpoint(engine, "a", url=old_url)
        seed(engine, 1, "a")
        async with running_poller(db_url, fast_settings()):
            await wait_for(_done(engine, 1))
            with engine.begin() as conn:
                conn.execute(text("UPDATE poller_endpoints SET url = :u"), {"u": new_url})
            with Session(engine) as session, session.begin():
                enqueue(session, endpoint="a", event_type="e", payload={}, idempotency_key="k2")
            await wait_for(_done(engine, 2))
    assert (old.stats.received, new.stats.received) == (1, 1)
