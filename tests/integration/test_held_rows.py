"""Outbox rows someone else holds: nothing an operator or an application holds open makes
a poller's heartbeat, completion or reclaim wait (docs/explanation/guarantees.md)."""

from __future__ import annotations

import asyncio
import time

import pytest
from sqlalchemy import Connection, Engine, text
from sqlalchemy.ext.asyncio import AsyncEngine

from poller import Message, enqueue_many
from poller.endpoints.registry import remove_endpoint
from poller.errors import EndpointBusy, EndpointDisabled
from poller.local.receiver import Faults
from poller.rows.claims import Claims
from poller.rules.outcomes import delivered
from tests.conftest import make_endpoint
from tests.integration.helpers import expire_claims, seed, wait_for
from tests.integration.service_helpers import fast_settings, running_poller, running_receiver

LEASE = 1.5  # the shortest a request timeout of 0.25 s allows: 3 leases held


def _interleaved(engine: Engine, held: int, others: int) -> None:
    """acme's messages among globex's, so the claims take both in the same batches."""
    from sqlalchemy.orm import Session

    every = others // held
    messages = []
    for i in range(others):
        if i % every == 0 and i // every < held:
            messages.append(Message("acme", "order.changed", {"i": i}, f"a{i}"))
        messages.append(Message("globex", "order.changed", {"i": i}, f"g{i}"))
    with Session(engine) as session, session.begin():
        enqueue_many(session, messages)


def _count(engine: Engine, sql: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(sql)).scalar_one())


# An operator's raw edit of one endpoint's rows (the UPDATE's case, row by row, is
# tests/integration/test_claims.py's; the hunt's operator holds either).
EDIT = (
    "DELETE FROM poller_outbox WHERE endpoint_id = (SELECT id FROM poller_endpoints "
    "WHERE name = 'acme')"
)


async def test_an_operators_open_edit_of_one_endpoints_rows_stalls_no_other(
    engine: Engine, db_url: str
) -> None:
    """An operator runs `BEGIN; DELETE FROM poller_outbox WHERE endpoint_id = acme` while
    acme's messages are in flight beside globex's, and keeps it open for three claim
    leases. globex's 2,000 are delivered and completed on the same poller meanwhile:
    not one lease expires, not one is sent twice. (The heartbeat and every completion
    used to wait for the operator: lease expiries and duplicates on globex.)"""
    settings = fast_settings(claim_lease=LEASE, request_timeout=0.25)
    async with (
        running_receiver() as (globex, globex_url),
        running_receiver(Faults(latency=0.1)) as (_acme, acme_url),
    ):
        make_endpoint(engine, "globex", url=globex_url)
        make_endpoint(engine, "acme", url=acme_url)
        _interleaved(engine, 100, 2000)
        operator: Connection | None = None
        async with running_poller(db_url, settings):

            async def acme_in_flight() -> bool:
                return (
                    _count(
                        engine,
                        "SELECT count(*) FROM poller_outbox o JOIN "
                        "poller_endpoints e ON e.id = o.endpoint_id "
                        "WHERE e.name = 'acme' AND o.status = 'in_flight'",
                    )
                    > 0
                )

            await wait_for(acme_in_flight, timeout=20)

            def hold() -> Connection:
                conn = engine.connect()
                conn.begin()
                conn.execute(text(EDIT))
                return conn

            operator = await asyncio.to_thread(hold)  # it may wait for a claim to commit
            held_since = time.monotonic()
            try:

                async def globex_delivered() -> bool:
                    return (
                        _count(
                            engine,
                            "SELECT count(*) FROM poller_outbox o JOIN "
                            "poller_endpoints e ON e.id = o.endpoint_id WHERE "
                            "e.name = 'globex' AND o.status = 'delivered'",
                        )
                        == 2000
                    )

                await wait_for(globex_delivered, timeout=30)
                while time.monotonic() - held_since < 3 * LEASE:  # held the whole time
                    await asyncio.sleep(0.1)
                await asyncio.to_thread(operator.commit)
            finally:
                await asyncio.to_thread(operator.close)

            async def settled() -> bool:
                return (
                    _count(
                        engine,
                        "SELECT count(*) FROM poller_outbox "
                        "WHERE status NOT IN ('delivered', 'failed')",
                    )
                    == 0
                )

            await wait_for(settled, timeout=20)
    expired_on_globex = _count(
        engine,
        "SELECT count(*) FROM poller_delivery_attempts a JOIN poller_endpoints e "
        "ON e.id = a.endpoint_id WHERE e.name = 'globex' AND a.outcome = 'lease_expired'",
    )
    assert (expired_on_globex, globex.stats.applied, globex.stats.duplicates) == (0, 2000, 0)


async def test_a_forced_removal_deletes_no_message_under_a_live_claim(
    engine: Engine, aengine: AsyncEngine
) -> None:
    """`endpoints remove --force` while one of its messages is on the wire: the others go
    at once, the endpoint takes nothing new, and the claimed one ends as its attempt
    says — applied, recorded — before it and the endpoint are deleted."""
    make_endpoint(engine, "acme")
    seed(engine, 3, endpoint="acme")
    claims = Claims(aengine, poller_id="p1", claim_lease=30)
    try:
        (claimed,) = await claims.claim_batch(limit=1)
        removal = asyncio.create_task(
            asyncio.to_thread(remove_endpoint, engine, "acme", force=True)
        )

        async def only_the_claimed_left() -> bool:
            return _count(engine, "SELECT count(*) FROM poller_outbox") == 1

        await wait_for(only_the_claimed_left, timeout=10)
        with pytest.raises(EndpointDisabled):
            seed(engine, 1, endpoint="acme")
        assert not removal.done()
        assert (await claims.complete([delivered(claimed, status_code=200)])).applied == [
            claimed.id
        ]
        assert await asyncio.wait_for(removal, timeout=10) == 3
    finally:
        await claims.close()
    assert _count(engine, "SELECT count(*) FROM poller_endpoints") == 0


async def test_a_forced_removal_takes_an_expired_claim_and_fences_its_outcome(
    engine: Engine, aengine: AsyncEngine
) -> None:
    make_endpoint(engine, "acme")
    seed(engine, 1, endpoint="acme")
    claims = Claims(aengine, poller_id="p1", claim_lease=30)
    try:
        (claimed,) = await claims.claim_batch(limit=1)
        expire_claims(engine)  # its poller froze
        assert await asyncio.to_thread(remove_endpoint, engine, "acme", force=True) == 1
        assert (await claims.complete([delivered(claimed)])).stale == [claimed.id]
    finally:
        await claims.close()


def test_a_forced_removal_waits_on_no_lock_and_a_second_one_finishes(engine: Engine) -> None:
    """A message another transaction holds locked: the removal does not wait on it past
    its bound; it says so, the endpoint stays disabled, and removing again finishes."""
    make_endpoint(engine, "acme")
    seed(engine, 2, endpoint="acme")
    with engine.connect() as other:
        other.begin()
        other.execute(text("SELECT 1 FROM poller_outbox ORDER BY id LIMIT 1 FOR UPDATE"))
        with pytest.raises(EndpointBusy, match="1 of its messages are still held"):
            remove_endpoint(engine, "acme", force=True, wait=0.2)
        other.rollback()
    with engine.connect() as conn:
        state = conn.execute(text("SELECT enabled, disabled_reason FROM poller_endpoints"))
        assert tuple(state.one()) == (False, "being removed")
    assert remove_endpoint(engine, "acme", force=True) == 1
