"""Outbox rows someone else holds: nothing an operator or an application holds open makes
a poller's heartbeat, completion or reclaim wait (docs/explanation/guarantees.md)."""

from __future__ import annotations

import asyncio
import time

from sqlalchemy import Connection, Engine, text

from poller import Message, enqueue_many
from poller.receiver import Faults
from tests.conftest import make_endpoint
from tests.integration.helpers import wait_for
from tests.integration.service_helpers import fast_settings, running_poller, running_receiver

LEASE = 2.0


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
    settings = fast_settings(claim_lease=LEASE, request_timeout=0.5)
    async with (
        running_receiver() as (globex, globex_url),
        running_receiver(Faults(latency=0.2)) as (_acme, acme_url),
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
