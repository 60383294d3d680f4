"""Operational events (poller/rows/events.py): what endpoint health reports, signed, to the
operator endpoint, and what happens when that endpoint is missing."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.orm import Session

from poller import Message, enqueue_many
from poller.endpoints.registry import new_secret
from poller.errors import ConfigurationError
from poller.local.receiver import Faults
from poller.rows.claims import Claims
from poller.rows.events import (
    CIRCUIT_CLOSED,
    CIRCUIT_OPENED,
    MESSAGE_FAILED,
    EventSink,
    OperationalEvent,
)
from poller.rules.health import HealthPolicy
from tests.conftest import make_endpoint
from tests.integration.health_helpers import (
    failing,
    health,
    recording,
)
from tests.integration.helpers import seed, wait_for
from tests.integration.service_helpers import (
    counts,
    fast_settings,
    running_poller,
    running_receiver,
)


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
