"""Maintenance: purge by retention removes only old finished rows, with their attempts; keys
stay spent for their own retention."""

from __future__ import annotations

import pytest
from prometheus_client import Gauge
from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.orm import Session

from poller import IdempotencyKeySpent, Message, enqueue, enqueue_many
from poller.endpoints.registry import CreatedEndpoint
from poller.observe import metrics
from poller.rows.claims import Claims
from poller.rules.outcomes import delivered, failed
from poller.service.maintenance import PER_ENDPOINT, GaugeRefresher, Purger
from tests.conftest import make_endpoint
from tests.integration.helpers import attempts_of, seed


async def test_purge_removes_only_old_finished_rows(
    aengine: AsyncEngine, engine: Engine, endpoint: CreatedEndpoint
) -> None:
    ids = seed(engine, 6)
    claims = Claims(aengine, poller_id="p", claim_lease=30)
    batch = {m.id: m for m in await claims.claim_batch(4)}
    await claims.complete(
        [
            delivered(batch[ids[0]]),
            delivered(batch[ids[1]]),
            failed(batch[ids[2]]),
            failed(batch[ids[3]]),
        ]
    )
    with engine.begin() as conn:  # age two of them (one of each kind) past retention
        conn.execute(
            text("UPDATE poller_outbox SET delivered_at = now() - interval '8 days' WHERE id = :i"),
            {"i": ids[0]},
        )
        conn.execute(
            text("UPDATE poller_outbox SET failed_at = now() - interval '31 days' WHERE id = :i"),
            {"i": ids[2]},
        )
    purger = Purger(aengine, delivered_age=7 * 86400, failed_age=30 * 86400)
    assert await purger.run_once() == 2
    with engine.connect() as conn:
        left = dict(conn.execute(text("SELECT id, status FROM poller_outbox")).all())
    assert set(left) == set(ids) - {ids[0], ids[2]}  # young finished rows and pending stay
    assert attempts_of(engine, ids[0]) == [] and attempts_of(engine, ids[1]) != []
    assert await purger.run_once() == 0


async def test_one_purge_run_takes_batches_until_caught_up_or_out_of_budget(
    aengine: AsyncEngine, engine: Engine, endpoint: CreatedEndpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One batch per sweep (1,000 per 5 s) could never keep up with delivery."""
    from poller.service import maintenance

    seed(engine, 250)
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE poller_outbox SET status = 'delivered', attempts = 1, "
                "delivered_at = now() - interval '8 days'"
            )
        )
    monkeypatch.setattr(maintenance, "PURGE_BATCH", 100)
    monkeypatch.setattr(maintenance, "PURGE_BUDGET", 0.0)  # spent after the first batch
    purger = Purger(aengine, delivered_age=7 * 86400, failed_age=30 * 86400)
    assert await purger.run_once() == 100
    monkeypatch.setattr(maintenance, "PURGE_BUDGET", 60.0)
    assert await purger.run_once() == 150  # two batches, the second short: caught up
    assert await purger.run_once() == 0


async def test_a_purged_key_stays_spent_until_its_own_retention(
    aengine: AsyncEngine, engine: Engine, endpoint: CreatedEndpoint
) -> None:
    """Re-enqueueing a delivered-then-purged key must not deliver the same key twice."""
    (msg_id,) = seed(engine, 1)
    claims = Claims(aengine, poller_id="p", claim_lease=30)
    (msg,) = await claims.claim_batch(1)
    await claims.complete([delivered(msg)])
    with engine.begin() as conn:
        conn.execute(text("UPDATE poller_outbox SET delivered_at = now() - interval '8 days'"))
    purger = Purger(aengine, delivered_age=7 * 86400, failed_age=30 * 86400, keys_age=60)
    assert await purger.run_once() == 1
    again = {"endpoint": "billing", "event_type": "test.event", "payload": {"n": 0}}
    with Session(engine) as session, pytest.raises(IdempotencyKeySpent, match="purged"):
        enqueue(session, **again, idempotency_key="billing:0")
    with Session(engine) as session, pytest.raises(IdempotencyKeySpent, match="purged"):
        fresh = Message("billing", "e", {}, "fresh")
        enqueue_many(session, [Message(**again, idempotency_key="billing:0"), fresh])
    with engine.begin() as conn:  # the key's own retention passes: it may start anew
        conn.execute(text("UPDATE poller_spent_keys SET purged_at = now() - interval '2 minutes'"))
    assert await purger.run_once() == 1
    with Session(engine) as session, session.begin():
        assert enqueue(session, **again, idempotency_key="billing:0") != msg_id


async def test_the_gauges_show_the_endpoints_with_something_to_show(
    aengine: AsyncEngine, engine: Engine
) -> None:
    """An endpoint at rest has no per-endpoint series: thousands of customers' idle
    endpoints cost no series and no refresh work. One with messages due, waiting
    behind a key, a circuit not closed or disabled has all of them; one that comes to
    rest loses them."""
    for name in ("gauge-rest", "gauge-due", "gauge-keyed", "gauge-open", "gauge-off"):
        make_endpoint(engine, name)
    seed(engine, 3, "gauge-due")
    seed(engine, 2, "gauge-keyed", ordering_key="k")
    seed(engine, 2, "gauge-off")
    with engine.begin() as conn:
        conn.execute(text("UPDATE poller_endpoints SET enabled = false WHERE name = 'gauge-off'"))
        conn.execute(
            text(
                "UPDATE poller_endpoint_health SET state = 'open',"
                " opened_at = now() - interval '1 minute'"
                " WHERE endpoint_id = (SELECT id FROM poller_endpoints WHERE name = 'gauge-open')"
            )
        )
    refresher = GaugeRefresher(aengine)
    await refresher.run_once()
    assert _series(metrics.PENDING_DUE) == {
        "gauge-due": 3,
        "gauge-keyed": 1,  # the key's head; the other waits
        "gauge-open": 0,
        "gauge-off": 2,
    }
    assert _series(metrics.ORDERING_WAITING)["gauge-keyed"] == 1
    assert _series(metrics.CIRCUIT_STATE)["gauge-open"] == 2
    assert _series(metrics.CIRCUIT_OPEN_SECONDS)["gauge-open"] >= 60
    assert _series(metrics.ENDPOINT_ENABLED) == {
        "gauge-due": 1,
        "gauge-keyed": 1,
        "gauge-open": 1,
        "gauge-off": 0,
    }
    assert _series(metrics.DISABLED_PENDING)["gauge-off"] == 2
    with engine.begin() as conn:
        conn.execute(
            text(
                "DELETE FROM poller_outbox WHERE endpoint_id ="
                " (SELECT id FROM poller_endpoints WHERE name = 'gauge-due')"
            )
        )
    await refresher.run_once()
    for gauge in PER_ENDPOINT:
        assert "gauge-due" not in _series(gauge) and "gauge-rest" not in _series(gauge)
        assert "gauge-open" in _series(gauge)


def _series(gauge: Gauge) -> dict[str, float]:
    """This test's endpoints' samples of a per-endpoint gauge (the registry is the
    process's: other tests' endpoints are in it too)."""
    return {
        sample.labels["endpoint"]: sample.value
        for family in gauge.collect()
        for sample in family.samples
        if sample.labels["endpoint"].startswith("gauge-")
    }
