"""Ordered delivery (poller/rows/ordering.py): positions, heads, hand-over, blocking, skipping,
and the race between an enqueue and a head ending."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.orm import Session

from poller import IdempotencyConflict, InvalidOrderingKey, Message, enqueue, enqueue_many
from poller.local.embedded import free_port
from poller.local.receiver import Receiver
from poller.operate.admin import retry_messages
from poller.rows.claims import Claims
from poller.rows.ordering import blocked_keys, skip_messages
from poller.rules import outcomes
from poller.store.db import poller_engine
from tests.conftest import make_endpoint
from tests.integration.helpers import wait_for
from tests.integration.service_helpers import fast_settings, running_poller, running_receiver


def put(engine: Engine, key: str | None, n: int, *, endpoint: str = "billing", start: int = 0):  # type: ignore[no-untyped-def]
    with Session(engine) as session, session.begin():
        return enqueue_many(
            session,
            [
                Message(endpoint, "order.changed", {"n": i}, f"{key}:{i}", ordering_key=key)
                for i in range(start, start + n)
            ],
        )


def states(engine: Engine) -> dict[int, str]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT id, status FROM poller_outbox"))
        return {r.id: r.status for r in rows}


def key_row(engine: Engine, key: str) -> Any:
    """The key's row, or None once the key has no open message."""
    with engine.connect() as conn:
        return conn.execute(
            text("SELECT * FROM poller_ordering_keys WHERE ordering_key = :k"), {"k": key}
        ).one_or_none()


def _lock_waits(engine: Engine) -> bool:
    """A session of this database waits on a lock."""
    with engine.connect() as conn:
        return bool(
            conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE wait_event_type = 'Lock' AND datname = current_database()"
                )
            ).scalar_one()
        )


@pytest.fixture(params=[False, True], ids=["one-transaction", "follow-ups-apart"])
async def claimer(aengine: AsyncEngine, request: pytest.FixtureRequest) -> AsyncIterator[Claims]:
    """Both ways to complete: in one transaction, and a delivery's rows first, alone."""
    claims = Claims(aengine, poller_id="p1", claim_lease=30, follow_ups_apart=request.param)
    yield claims
    await claims.close()


@pytest.mark.parametrize("bad", ["", " ", "a b", "é", "x" * 256, 42, "line\n"])
def test_bad_ordering_keys_are_refused(engine: Engine, endpoint: Any, bad: Any) -> None:
    with pytest.raises(InvalidOrderingKey), Session(engine) as session:
        enqueue(
            session,
            endpoint="billing",
            event_type="a.b",
            payload={},
            idempotency_key="k",
            ordering_key=bad,
        )


def test_only_the_head_of_a_key_is_pending(engine: Engine, endpoint: Any) -> None:
    a = put(engine, "order:1", 3)
    b = put(engine, "order:2", 2)
    free = put(engine, None, 2)
    found = states(engine)
    assert [found[i] for i in a] == ["pending", "waiting", "waiting"]
    assert [found[i] for i in b] == ["pending", "waiting"]
    assert [found[i] for i in free] == ["pending"] * 2
    assert key_row(engine, "order:1").head_id == a[0]
    later = put(engine, "order:1", 1, start=3)  # a later transaction: behind the head
    assert states(engine)[later[0]] == "waiting" and later[0] > a[-1]


def test_a_duplicate_head_hands_the_key_to_the_first_new_message(
    engine: Engine, endpoint: Any
) -> None:
    (first,) = put(engine, "k", 1)
    with engine.begin() as conn:  # the head ends and the key is idle
        conn.execute(text("UPDATE poller_outbox SET status = 'delivered'"))
        conn.execute(text("DELETE FROM poller_ordering_keys"))
    again = put(engine, "k", 3)  # k:0 is an idempotent replay: not inserted
    assert again[0] == first
    found = states(engine)
    assert [found[i] for i in again[1:]] == ["pending", "waiting"]
    assert key_row(engine, "k").head_id == again[1]
    assert put(engine, "k", 1) == [first]  # a replay on a live key changes nothing
    with engine.begin() as conn:  # the whole key ends
        conn.execute(text("UPDATE poller_outbox SET status = 'delivered'"))
        conn.execute(text("DELETE FROM poller_ordering_keys"))
    assert put(engine, "k", 1) == [first]  # only a replay: no key row is left behind
    assert key_row(engine, "k") is None
    other_key = Message("billing", "order.changed", {"n": 0}, "k:0", ordering_key="z")
    with pytest.raises(IdempotencyConflict), Session(engine) as session, session.begin():
        enqueue_many(session, [other_key])  # the same message on another ordering key
    with pytest.raises(IdempotencyConflict), Session(engine) as session:
        enqueue(session, endpoint="billing", event_type="order.changed", payload={"n": 0},
                idempotency_key="k:0")  # fmt: skip
    assert key_row(engine, "z") is None


async def _deliver_all(claimer: Claims, outcome: Any = outcomes.delivered) -> list[int]:
    batch = await claimer.claim_batch(limit=100)
    await claimer.complete([outcome(m) for m in batch])
    return [m.id for m in batch]


async def test_a_delivered_head_hands_the_key_on_in_order(
    engine: Engine, endpoint: Any, claimer: Claims
) -> None:
    a = put(engine, "a", 3)
    b = put(engine, "b", 2)
    seen = []
    for _ in range(4):
        seen.append(sorted(await _deliver_all(claimer)))
    assert seen == [[a[0], b[0]], [a[1], b[1]], [a[2]], []]
    assert key_row(engine, "a") is None  # no open message: the key's row is gone
    (tail,) = put(engine, "a", 1, start=3)
    assert states(engine)[tail] == "pending"  # an idle key starts pending


async def test_retries_keep_the_head_and_a_failed_head_blocks_its_key(
    engine: Engine, claimer: Claims
) -> None:
    make_endpoint(engine, "billing", max_attempts=2)
    a = put(engine, "a", 3)
    free = put(engine, None, 1)
    assert sorted(await _deliver_all(claimer, lambda m: outcomes.retry(m, 0))) == [a[0], free[0]]
    assert states(engine)[a[1]] == "waiting"  # a retry is not an end
    last = await _deliver_all(claimer, lambda m: outcomes.retry(m, 0))  # the last attempt
    assert sorted(last) == [a[0], free[0]]
    assert states(engine)[a[0]] == "failed"
    assert await claimer.claim_batch(limit=100) == []  # blocked: nothing else of "a"
    with engine.connect() as conn:
        (blocked,) = blocked_keys(conn)
    assert (blocked["ordering_key"], blocked["head_id"], blocked["waiting"]) == ("a", a[0], 2)

    assert retry_messages(engine, [a[0]], who="ops") == 1  # resumes the key
    assert key_row(engine, "a").blocked_since is None
    assert await _deliver_all(claimer) == [a[0]]
    assert await _deliver_all(claimer) == [a[1]]


async def test_skip_moves_a_blocked_key_on_and_skip_endpoints_do_it_themselves(
    engine: Engine, claimer: Claims
) -> None:
    make_endpoint(engine, "billing", max_attempts=1)
    make_endpoint(engine, "lenient", max_attempts=1, on_failed_head="skip")
    a = put(engine, "a", 2)
    s = put(engine, "s", 2, endpoint="lenient")
    await _deliver_all(claimer, outcomes.failed)
    found = states(engine)
    assert (found[a[1]], found[s[1]]) == ("waiting", "pending")
    with engine.begin() as conn:
        assert skip_messages(conn, [a[0], 999_999], who="ops") == [a[0]]
    assert states(engine)[a[1]] == "pending"
    with engine.connect() as conn:
        assert blocked_keys(conn) == []


async def test_a_reclaimed_head_that_ran_out_of_attempts_ends_its_turn(
    engine: Engine, aengine: AsyncEngine
) -> None:
    make_endpoint(engine, "billing", max_attempts=1, on_failed_head="skip")
    a = put(engine, "a", 2)
    short = Claims(aengine, poller_id="dead", claim_lease=0.05)
    assert [m.id for m in await short.claim_batch(limit=10)] == [a[0]]

    async def reclaimed() -> bool:
        return bool((await short.completions.reclaim_expired()).failed)

    await wait_for(reclaimed, timeout=5)
    assert states(engine)[a[1]] == "pending"


def test_purge_keeps_the_failed_head_of_a_blocked_key(engine: Engine, endpoint: Any) -> None:
    from poller.store import queries

    a = put(engine, "a", 2)
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE poller_outbox SET status = 'failed', failed_at = now() - interval '1 day'"
                " WHERE id = :id"
            ),
            {"id": a[0]},
        )
        assert conn.execute(queries.PURGE_FAILED, {"age": 60, "limit": 100}).scalar_one() == 0


async def test_an_open_transaction_on_a_key_never_makes_a_completion_wait(
    engine: Engine, endpoint: Any, claimer: Claims
) -> None:
    """An application enqueued on the key and has not committed when the head ends: the
    completion (and the other outcomes in its batch, and the heartbeat) go through at
    once; the key is handed on by the next completion after the commit, in order."""
    (head,) = put(engine, "a", 1)
    free = put(engine, None, 3)
    batch = await claimer.claim_batch(limit=10)
    assert sorted(m.id for m in batch) == sorted([head, *free])
    session = Session(engine)
    session.begin()
    (tail,) = enqueue_many(session, [Message("billing", "e.v", {}, "a:1", ordering_key="a")])
    try:
        async with asyncio.timeout(5):  # it used to wait for the commit, however long
            result = await claimer.complete([outcomes.delivered(m) for m in batch])
            assert (await claimer.extend({m.id: m.claim_token for m in batch})).extended == set()
        assert sorted(result.applied) == sorted([head, *free])
        assert claimer.completions.carried == 1  # the key, for later
        assert key_row(engine, "a").head_id == head
        await claimer.complete([])  # still held: carried again, nothing waits
        assert claimer.completions.carried == 1
    finally:
        session.commit()
        session.close()
    assert (await claimer.complete([])).promoted == 1
    assert claimer.completions.carried == 0
    assert states(engine)[tail] == "pending"
    assert key_row(engine, "a").head_id == tail


async def test_follow_ups_that_meet_a_database_away_are_carried_not_lost(
    engine: Engine, aengine: AsyncEngine, endpoint: Any
) -> None:
    """A delivered head's row is written alone (the service's way); its key's hand-over
    then meets a database away. The row stays delivered, the hand-over is carried, and
    the next call makes it."""
    head, tail = put(engine, "a", 2)
    claims = Claims(aengine, poller_id="p1", claim_lease=30, follow_ups_apart=True)
    (claimed,) = await claims.claim_batch(limit=10)
    away = poller_engine(f"postgresql://u:p@127.0.0.1:{free_port()}/x", fast_settings())
    claims.completions.engine = away  # the follow-ups cannot begin; COMPLETE_BATCH can
    try:
        assert (await claims.complete([outcomes.delivered(claimed)])).applied == [head]
        # the key's hand-over, and the endpoint's first success
        assert claims.completions.carried == 2
        assert states(engine) == {head: "delivered", tail: "waiting"}
        claims.completions.engine = aengine
        assert (await claims.complete([])).promoted == 1
    finally:
        await away.dispose()
        await claims.close()
    assert claims.completions.carried == 0
    assert states(engine)[tail] == "pending"
    with engine.connect() as conn:
        judged = text("SELECT last_success_at FROM poller_endpoint_health")
        assert conn.execute(judged).scalar_one() is not None


async def test_a_key_held_open_for_three_leases_holds_back_only_itself(
    engine: Engine, db_url: str
) -> None:
    """An application enqueues on key K and keeps its transaction open for 3 claim
    leases while K's head is delivered. Meanwhile 2,000 other messages to the same
    endpoint are delivered with no lease expiring and no duplicate; after the commit
    K goes on, in order. (It used to deliver 0, with thousands of lease expiries.)"""
    lease = 2.0
    settings = fast_settings(claim_lease=lease, request_timeout=0.5)
    async with running_receiver() as (receiver, url):
        make_endpoint(engine, "billing", url=url)
        k = put(engine, "K", 2)
        session = Session(engine)
        session.begin()
        enqueue_many(session, [Message("billing", "order.changed", {}, "K:2", ordering_key="K")])
        held_since = time.monotonic()
        try:
            others = put(engine, None, 2000)
            async with running_poller(db_url, settings):

                async def others_delivered() -> bool:
                    done = states(engine)
                    return all(done[i] == "delivered" for i in [k[0], *others])

                await wait_for(others_delivered, timeout=30)  # K held all along
                while time.monotonic() - held_since < 3 * lease:  # hold it the whole time
                    assert states(engine)[k[1]] == "waiting"
                    await asyncio.sleep(0.1)
                session.commit()

                async def all_delivered() -> bool:
                    return set(states(engine).values()) == {"delivered"}

                await wait_for(all_delivered, timeout=10)
        finally:
            session.close()
    with engine.connect() as conn:
        expired = conn.execute(
            text("SELECT count(*) FROM poller_delivery_attempts WHERE outcome = 'lease_expired'")
        ).scalar_one()
    assert expired == 0
    assert (receiver.stats.applied, receiver.stats.duplicates) == (2003, 0)
    assert (receiver.stats.ordered, receiver.stats.order_violations) == (3, 0)


async def test_maintenance_hands_on_a_key_a_stopped_poller_left(
    engine: Engine, endpoint: Any, aengine: AsyncEngine
) -> None:
    a = put(engine, "a", 2)
    gone = Claims(aengine, poller_id="gone", claim_lease=30)
    (claimed,) = await gone.claim_batch(limit=10)
    with engine.begin() as conn:  # the key's row is held while the head completes
        conn.execute(text("SELECT 1 FROM poller_ordering_keys FOR UPDATE"))
        await gone.complete([outcomes.delivered(claimed)])
    assert gone.completions.carried == 1  # ... and that poller stops here
    sweeper = Claims(aengine, poller_id="leader", claim_lease=30)
    assert await sweeper.completions.sweep_follow_ups() == 1
    assert states(engine)[a[1]] == "pending"
    assert await sweeper.completions.sweep_follow_ups() == 0
    await gone.complete([])  # it comes back: the key was handed on, nothing left to carry
    assert gone.completions.carried == 0


def test_the_reference_receiver_counts_order_violations() -> None:
    receiver = Receiver()

    def apply(key: str, seq: bytes) -> None:
        headers = {b"webhook-ordering-key": b"k", b"webhook-ordering-seq": seq}
        receiver._apply(key, b"{}", 0.0, headers)

    apply("1", b"1")
    apply("3", b"3")
    apply("1", b"1")  # a duplicate: not applied again, not a violation
    apply("2", b"2")  # applied after 3: a violation
    assert (receiver.stats.ordered, receiver.stats.order_violations) == (3, 1)


def test_enqueue_on_a_key_waits_for_the_transaction_holding_it(
    engine: Engine, endpoint: Any
) -> None:
    """Positions follow commit order: a second transaction on the key waits for the first."""
    first = Session(engine)
    first.begin()
    enqueue_many(first, [Message("billing", "e.v", {}, "a:0", ordering_key="a")])
    done = threading.Event()

    def second() -> None:
        put(engine, "a", 1, start=1)
        done.set()

    thread = threading.Thread(target=second)
    thread.start()
    deadline = time.monotonic() + 10
    while not _lock_waits(engine):  # the second waits on the first's key lock
        assert time.monotonic() < deadline and not done.is_set()
        time.sleep(0.01)
    assert not done.is_set()
    first.commit()
    first.close()
    thread.join(10)
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT idempotency_key, status FROM poller_outbox ORDER BY id")
        ).all()
    assert [tuple(r) for r in rows] == [("a:0", "pending"), ("a:1", "waiting")]


async def test_four_pollers_keep_every_key_in_order_through_failures_and_drops(
    engine: Engine, db_url: str
) -> None:
    """50 keys x 20 messages, interleaved with unordered traffic; the receiver fails 10 %
    and drops 2 % after applying (outcome unknown: lookups). Counted at the receiver."""
    import contextlib
    import random

    from poller.local.receiver import Faults
    from tests.integration.service_helpers import (
        counts,
        fast_settings,
        running_poller,
        running_receiver,
    )

    faults = Faults(fail_rate=0.1, drop_after_process_rate=0.02, rng=random.Random(7))
    async with running_receiver(faults) as (receiver, url):
        make_endpoint(
            engine,
            "billing",
            url=f"{url}/hook",
            lookup_url=f"{url}/webhooks/{{idempotency_key}}",
            max_attempts=50,
        )
        order = [(f"order:{k}", i) for i in range(20) for k in range(50)]
        with Session(engine) as session, session.begin():
            enqueue_many(
                session,
                [Message("billing", "o.c", {"i": i}, f"{k}:{i}", ordering_key=k) for k, i in order]
                + [Message("billing", "free", {"i": i}, f"free:{i}") for i in range(200)],
            )
        settings = fast_settings(retry_schedule=[0.01, 0.05])
        async with contextlib.AsyncExitStack() as stack:
            for n in range(4):
                await stack.enter_async_context(running_poller(db_url, settings, f"p{n}"))

            async def settled() -> bool:
                return counts(engine).get("delivered", 0) == 1200

            await wait_for(settled, timeout=90, interval=0.1)
    assert receiver.stats.applied == 1200 and receiver.stats.ordered == 1000
    assert receiver.stats.order_violations == 0
    assert receiver.stats.failed_injected > 0 and receiver.stats.dropped_injected > 0


def test_the_operator_story_on_the_command_line(engine: Engine, db_url: str) -> None:
    """A key blocks behind a failed head; `admin blocked` shows it, `admin skip` moves on."""
    import json

    from click.testing import CliRunner

    from poller.cli import cli

    def run(*args: str) -> tuple[int, str]:
        result = CliRunner().invoke(cli, list(args), env={"POLLER_DATABASE_URL": db_url})
        return result.exit_code, result.output

    code, out = run("endpoints", "add", "shop", "http://127.0.0.1:9/", "--on-failed-head", "skip")
    assert code == 0, out
    code, out = run("endpoints", "update", "shop", "--on-failed-head", "block", "--json")
    assert json.loads(out)["on_failed_head"] == "block"
    ids = []
    for n in range(3):
        code, out = run(
            "enqueue", "shop", "order.changed", "--data", "{}", "--key", f"o:{n}",
            "--ordering-key", "order:7",
        )  # fmt: skip
        assert code == 0, out
        ids.append(int(out.split()[1]))
    assert states(engine)[ids[1]] == "waiting"
    with engine.begin() as conn:  # the head fails for good on a "block" endpoint
        conn.execute(
            text(
                "UPDATE poller_outbox SET status = 'failed', last_error = 'HTTP 500' WHERE id = :i"
            ),
            {"i": ids[0]},
        )
        from poller.rows.ordering import advance_keys_sync

        advance_keys_sync(conn, [ids[0]])
    code, out = run("admin", "stats", "--json")
    assert json.loads(out)["endpoints"]["shop"]["waiting"] == 2, out
    code, out = run("admin", "blocked", "--json")
    (blocked,) = json.loads(out)
    assert (blocked["ordering_key"], blocked["head_id"], blocked["waiting"]) == (
        "order:7",
        ids[0],
        2,
    )
    code, out = run("admin", "skip", str(ids[1]), "--yes")  # not the head: skipped, no move
    assert code == 0 and states(engine)[ids[2]] == "waiting"
    code, out = run("admin", "skip", str(ids[0]), "--yes")
    assert code == 0 and f"skipped 1: {ids[0]}" in out
    assert states(engine)[ids[2]] == "pending"  # ids[1] was skipped: the next is ids[2]
    code, out = run("admin", "blocked")
    assert code == 0 and "order:7" not in out
    code, out = run("admin", "skip", "999999", "--yes")
    assert code == 1 and "nothing skipped" in out
    code, out = run("enqueue", "shop", "e.v", "--data", "{}", "--key", "x", "--ordering-key", "a b")
    assert code == 2 and out.startswith("error: ordering_key may hold only visible ASCII")


async def test_a_blocked_key_holds_back_nothing_but_itself(engine: Engine, claimer: Claims) -> None:
    make_endpoint(engine, "billing", max_attempts=1)
    a = put(engine, "a", 3)
    await _deliver_all(claimer, outcomes.failed)  # "a" is blocked behind a[0]
    b = put(engine, "b", 2)
    free = put(engine, None, 2)
    assert sorted(await _deliver_all(claimer)) == sorted([b[0], *free])
    assert await _deliver_all(claimer) == [b[1]]
    found = states(engine)
    assert [found[i] for i in a] == ["failed", "waiting", "waiting"]


@pytest.mark.parametrize("policy", ["maybe", "", "BLOCK", 1])
def test_a_failed_head_policy_must_be_block_or_skip(engine: Engine, policy: Any) -> None:
    from poller.endpoints.registry import update_endpoint
    from poller.errors import InvalidEndpoint

    with pytest.raises(InvalidEndpoint, match="on_failed_head must be one of block, skip"):
        make_endpoint(engine, "a", on_failed_head=policy)
    make_endpoint(engine, "b")
    with pytest.raises(InvalidEndpoint, match="on_failed_head"), engine.begin() as conn:
        update_endpoint(conn, "b", on_failed_head=policy)
