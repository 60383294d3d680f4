"""Wake-ups: NOTIFY reaches listeners when — and only when — the enqueue commits."""

from __future__ import annotations

import time

import psycopg
import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from poller import Message, enqueue, enqueue_many
from poller.settings import default_settings
from poller.store.db import libpq_url
from poller.store.schema import NOTIFY_CHANNEL
from tests.conftest import make_endpoint


def _listener(db_url: str) -> psycopg.Connection:
    conn = psycopg.connect(libpq_url(db_url), autocommit=True)
    conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
    return conn


def _first_payloads(listener: psycopg.Connection, n: int = 1) -> list[str]:
    return [note.payload for note in listener.notifies(timeout=5, stop_after=n)]


def test_rolled_back_enqueue_wakes_nobody_committed_one_does(engine: Engine, db_url: str) -> None:
    rolled = make_endpoint(engine, "rolled").endpoint
    committed = make_endpoint(engine, "committed").endpoint
    assert rolled.bucket != committed.bucket
    with _listener(db_url) as listener:
        with Session(engine) as session:
            enqueue(session, endpoint="rolled", event_type="e", payload={}, idempotency_key="k")
            session.rollback()
        with Session(engine) as session, session.begin():
            enqueue(session, endpoint="committed", event_type="e", payload={}, idempotency_key="k")
        # The first (and only) wake-up is the committed one's.
        assert _first_payloads(listener) == [str(committed.bucket)]
        assert list(listener.notifies(timeout=0.2)) == []


def test_enqueue_many_wakes_each_bucket_once(engine: Engine, db_url: str) -> None:
    a = make_endpoint(engine, "a").endpoint
    b = make_endpoint(engine, "b").endpoint
    batch = [Message(name, "e", {"i": i}, f"k{i}") for i in range(50) for name in ("a", "b")]
    with _listener(db_url) as listener:
        with Session(engine) as session, session.begin():
            enqueue_many(session, batch)
        assert sorted(_first_payloads(listener, 2)) == sorted([str(a.bucket), str(b.bucket)])
        assert list(listener.notifies(timeout=0.2)) == []


def test_notify_off_sends_no_wake_up(
    engine: Engine, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_endpoint(engine, "a")
    monkeypatch.setenv("POLLER_NOTIFY", "off")
    default_settings.cache_clear()
    with _listener(db_url) as listener:
        with Session(engine) as session, session.begin():
            enqueue(session, endpoint="a", event_type="e", payload={}, idempotency_key="k")
            enqueue_many(session, [Message("a", "e", {}, "k2")])
        assert list(listener.notifies(timeout=0.3)) == []


async def test_deliveries_ending_with_nothing_more_due_make_no_claim(
    engine: Engine, db_url: str
) -> None:
    """A transaction of 10 is one claim: the deliveries ending free room, but the claim
    took all that was due, so no claim follows (at 3,000 messages/s in transactions of
    10, more than half the claims came back empty)."""
    from tests.integration.helpers import seed, wait_for
    from tests.integration.service_helpers import (
        counts,
        fast_settings,
        running_poller,
        running_receiver,
    )

    async with running_receiver() as (_, url):
        make_endpoint(engine, "billing", url=url)
        async with running_poller(db_url, fast_settings(poll_interval=30)) as poller:
            claims: list[float] = []  # when each claim cycle ended
            poller.claimer.on_cycle.append(lambda _: claims.append(time.monotonic()))
            ended: list[float] = []  # when the deliveries in flight came to none
            room_freed = poller.dispatcher.on_room

            def on_room() -> None:
                if not poller.dispatcher.tasks:
                    ended.append(time.monotonic())
                room_freed()

            poller.dispatcher.on_room = on_room

            async def listening() -> bool:  # its connect's wake-up claimed (a loaded
                # machine connected it after the deliveries: a claim after them)
                return poller.claimer.listening and not poller.claimer.wake.is_set()

            await wait_for(listening, timeout=10)
            seed(engine, 10)

            async def written() -> bool:
                return counts(engine) == {"delivered": 10}

            await wait_for(written, timeout=10)
            assert ended and claims
            assert max(claims) < ended[-1]  # no claim after the last delivery ended


async def test_slow_deliveries_that_took_all_that_was_due_wake_no_empty_claim(
    engine: Engine, db_url: str
) -> None:
    """A claim took every due message; its deliveries wait on a slow receiver past
    POLLER_WAITING_AFTER, which frees room — but room finds nothing more: no claim runs
    until something new comes. (The claimer woke when the first delivery began to
    wait and claimed nothing, once per batch: the empty claim after the last delivery
    a loaded machine showed.)"""
    from poller.local.receiver import Faults
    from tests.integration.helpers import seed, wait_for
    from tests.integration.service_helpers import (
        counts,
        fast_settings,
        running_poller,
        running_receiver,
    )

    # Deliveries wait 1 s on the receiver, and count as waiting after 0.5 s. A NOTIFY
    # may arrive while the claim that takes its rows runs, and wake one empty claim
    # right after it: only claims later than waiting_after / 2 are what this is about.
    settings = fast_settings(
        poll_interval=30, waiting_after=0.5, request_timeout=3.0, claim_lease=10.0
    )
    async with running_receiver(Faults(latency=1.0)) as (_, url):
        make_endpoint(engine, "billing", url=url)
        async with running_poller(db_url, settings) as poller:
            cycles: list[tuple[float, int]] = []  # when each claim cycle ended, what it took
            poller.claimer.on_cycle.append(lambda n: cycles.append((time.monotonic(), n)))
            await wait_for(lambda: poller.claimer.listening, timeout=10)
            seed(engine, 5)
            await wait_for(lambda: counts(engine) == {"delivered": 5}, timeout=10)
    took = next(at for at, n in cycles if n == 5)
    late = [n for at, n in cycles if at > took + 0.25]
    assert late == [], f"claims while the deliveries waited: {late}"
