"""The service rides out a PostgreSQL restart, and works without NOTIFY."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from poller.local.embedded import EmbeddedPostgres
from poller.local.receiver import Faults
from poller.observe import metrics
from poller.store import migrate
from poller.store.db import sync_engine
from tests.conftest import make_endpoint
from tests.integration.helpers import seed, wait_for
from tests.integration.service_helpers import (
    counts,
    fast_settings,
    running_poller,
    running_receiver,
)


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[tuple[EmbeddedPostgres, str]]:
    """A PostgreSQL of this test's own, free to restart."""
    server = EmbeddedPostgres(tmp_path, durable=False)
    url = server.start()
    migrate.upgrade(url)
    try:
        yield server, url
    finally:
        server.stop()


@pytest.mark.slow
async def test_postgres_restart_under_load_loses_nothing(
    own_server: tuple[EmbeddedPostgres, str],
) -> None:
    server, url = own_server
    engine: Engine = sync_engine(url)
    total = 2000
    try:
        async with running_receiver(Faults(latency=0.005)) as (receiver, receiver_url):
            make_endpoint(engine, "a", url=receiver_url)
            seed(engine, total, "a")
            db_errors = metrics.sample_total(metrics.DB_ERRORS)
            async with running_poller(url, fast_settings(claim_lease=5.0)):

                async def under_way() -> bool:
                    return receiver.stats.applied >= 200

                await wait_for(under_way, timeout=20)
                await asyncio.to_thread(server.restart)

                async def all_delivered() -> bool:
                    try:
                        return counts(engine) == {"delivered": total}
                    except Exception:  # the test's own engine may meet the restart too
                        return False

                await wait_for(all_delivered, timeout=60)
        assert receiver.stats.applied == total  # nothing lost
        assert metrics.sample_total(metrics.DB_ERRORS) > db_errors  # it did meet the restart
    finally:
        engine.dispose()


async def test_polling_without_notify(engine: Engine, db_url: str) -> None:
    async with running_receiver() as (receiver, url):
        make_endpoint(engine, "a", url=url)
        settings = fast_settings(notify=False, poll_interval=0.1)
        async with running_poller(db_url, settings):
            seed(engine, 50, "a")

            async def delivered() -> bool:
                return counts(engine) == {"delivered": 50}

            await wait_for(delivered, timeout=10)
    assert receiver.stats.applied == 50


async def test_poller_sessions_end_transactions_left_idle(db_url: str) -> None:
    from sqlalchemy import text

    from poller.store.db import poller_engine

    engine = poller_engine(db_url, fast_settings(lease_ttl=1.5))
    try:
        async with engine.connect() as conn:
            await conn.execute(text("SELECT 1"))
            await conn.rollback()  # the pool's reset must not undo the setting
        async with engine.connect() as conn:
            value = (await conn.execute(text("SHOW idle_in_transaction_session_timeout"))).scalar()
        assert value == "5s"
    finally:
        await engine.dispose()
