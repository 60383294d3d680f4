"""Slow receivers take no fast receiver's room: a delivery waiting for its answer stops
counting against the concurrency, a tenant holds at most its ceiling, and a message
just committed is claimed before the walk comes round to it."""

from __future__ import annotations

import time

from sqlalchemy import Engine
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.orm import Session

from poller import Message, enqueue_many
from poller.local.receiver import Faults
from poller.rows.claims import Claims
from tests.conftest import make_endpoint
from tests.integration.helpers import wait_for
from tests.integration.service_helpers import fast_settings, running_poller, running_receiver


def _enqueue(engine: Engine, endpoint: str, n: int, prefix: str) -> None:
    with Session(engine) as session, session.begin():
        enqueue_many(
            session,
            [Message(endpoint, "order.created", {"n": i}, f"{prefix}{i}") for i in range(n)],
        )


async def test_slow_receivers_do_not_take_a_fast_ones_room(engine: Engine, db_url: str) -> None:
    """Four slots, four slow endpoints holding twenty deliveries of two seconds: a fast
    endpoint's messages arrive in well under a second each (they used to wait for the
    slow answers: two seconds and more)."""
    settings = fast_settings(concurrency=4, waiting_after=0.05, request_timeout=3.0,
                             claim_lease=8.0)  # fmt: skip
    async with (
        running_receiver(Faults(latency=2.0)) as (_slow, slow_url),
        running_receiver() as (fast, fast_url),
    ):
        for i in range(4):
            make_endpoint(engine, f"slow-{i}", url=slow_url)
            _enqueue(engine, f"slow-{i}", 5, f"s{i}:")
        make_endpoint(engine, "fast", url=fast_url)
        async with running_poller(db_url, settings) as poller:
            await wait_for(lambda: len(poller.dispatcher.tasks) >= 8, timeout=10)
            committed = time.monotonic()
            _enqueue(engine, "fast", 5, "f")
            await wait_for(lambda: fast.stats.applied == 5, timeout=10)
            assert time.monotonic() - committed < 1.0


async def test_a_tenant_at_its_ceiling_is_claimed_no_more(
    engine: Engine, aengine: AsyncEngine
) -> None:
    for name, tenant in (("acme-hooks", "acme"), ("globex-hooks", "globex"), ("ours", None)):
        make_endpoint(engine, name, tenant=tenant)
        _enqueue(engine, name, 3, f"{name}:")
    claims = Claims(aengine, poller_id="p1", claim_lease=30)
    try:
        taken = await claims.claim_batch(limit=100, full_tenants=["acme"])
        endpoints = {m.endpoint_id for m in taken}
        assert len(taken) == 6 and len(endpoints) == 2  # globex's and the untenanted's
        assert len(await claims.claim_batch(limit=100)) == 3  # acme's, once it has room
    finally:
        await claims.close()


async def test_a_claim_walks_a_notified_bucket_first_and_keeps_the_turn(
    engine: Engine, aengine: AsyncEngine
) -> None:
    """Endpoints with backlogs, and a new message for another: the claim woken by its
    NOTIFY takes it first; the claims after it go on where the turn was."""
    names = [f"busy-{i}" for i in range(4)]
    made = {name: make_endpoint(engine, name).endpoint for name in [*names, "new"]}
    for name in names:
        _enqueue(engine, name, 5, f"{name}:")
    _enqueue(engine, "new", 1, "new:")
    claims = Claims(aengine, poller_id="p1", claim_lease=30)
    try:
        first = await claims.claim_batch(limit=2, first_bucket=made["new"].bucket)
        assert made["new"].id in {m.endpoint_id for m in first}
        turn = [
            (await claims.claim_batch(limit=5, default_max_in_flight=5))[0].endpoint_id
            for _ in names
        ]
        assert sorted(turn) == sorted(made[n].id for n in names)  # each busy one in turn
    finally:
        await claims.close()


async def test_the_notified_claim_takes_a_message_while_little_room_is_left(
    engine: Engine, db_url: str
) -> None:
    """Room below a quarter of the capacity: a claim waits for more to free — but not
    a message just committed, which a NOTIFY announced."""
    settings = fast_settings(concurrency=8, waiting_after=30.0, request_timeout=3.0,
                             claim_lease=8.0, poll_interval=5.0)  # fmt: skip
    async with (
        running_receiver(Faults(latency=2.0)) as (_slow, slow_url),
        running_receiver() as (fast, fast_url),
    ):
        make_endpoint(engine, "slow", url=slow_url, max_in_flight=7)
        make_endpoint(engine, "fast", url=fast_url)
        _enqueue(engine, "slow", 7, "s")
        async with running_poller(db_url, settings) as poller:
            await wait_for(lambda: len(poller.dispatcher.tasks) == 7, timeout=10)
            committed = time.monotonic()
            _enqueue(engine, "fast", 1, "f")
            await wait_for(lambda: fast.stats.applied == 1, timeout=10)
            assert time.monotonic() - committed < 1.0
