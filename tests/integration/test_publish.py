"""Fan-out (poller/outbox/publish.py): publish once, a delivery per subscribed endpoint."""

from __future__ import annotations

import functools
import time
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, event, select, text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from sqlalchemy.orm import Session

from poller import (
    EnqueueError,
    Event,
    EventConflict,
    IdempotencyConflict,
    IdempotencyKeySpent,
    InvalidEventType,
    InvalidPayload,
    InvalidSubscription,
    InvalidTenant,
    enqueue,
    publish,
    publish_async,
    publish_many,
    publish_many_async,
)
from poller.endpoints.registry import set_enabled, update_endpoint
from poller.endpoints.subscriptions import subscribed
from poller.rules.health import DEFAULT
from poller.store.schema import event_log
from tests.conftest import make_endpoint


def _publish(engine: Engine, **fields: Any) -> Any:
    base: dict[str, Any] = {
        "event_type": "invoice.paid",
        "payload": {"invoice": 42, "region": "eu"},
        "idempotency_key": "invoice:42:paid",
    }
    with Session(engine) as session, session.begin():
        return publish(session, **{**base, **fields})


def _rows(engine: Engine) -> list[Any]:
    with engine.connect() as conn:
        return list(
            conn.execute(
                text(
                    "SELECT o.id, e.name, o.status, o.payload, o.event_id, o.idempotency_key, "
                    "o.event_type FROM poller_outbox o "
                    "JOIN poller_endpoints e ON e.id = o.endpoint_id ORDER BY e.name, o.id"
                )
            )
        )


def _events(engine: Engine) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(select(event_log).order_by(event_log.c.id)))


@pytest.fixture
def five(engine: Engine) -> Engine:
    """Five endpoints: three reached by invoice.paid {region: eu} (by name, by pattern, by
    filter), one of another tenant, one subscribed to another type."""
    make_endpoint(engine, "by-name", event_types=["invoice.paid", "customer.created"])
    make_endpoint(engine, "by-pattern", event_types=["invoice.*"])
    make_endpoint(engine, "by-filter", event_types=["*"], payload_filter={"region": "eu"})
    make_endpoint(engine, "other-tenant", event_types=["*"], tenant="globex")
    make_endpoint(engine, "other-type", event_types=["customer.*", "invoice"])
    make_endpoint(engine, "us-only", event_types=["*"], payload_filter={"region": "us"})
    make_endpoint(engine, "enqueue-only")
    return engine


def test_an_event_reaches_the_subscribed_endpoints_only(five: Engine) -> None:
    published = _publish(five)
    assert sorted(published.deliveries) == ["by-filter", "by-name", "by-pattern"]
    assert published.created
    rows = _rows(five)
    assert [r.name for r in rows] == ["by-filter", "by-name", "by-pattern"]
    assert {r.event_id for r in rows} == {published.event_id}
    assert {r.idempotency_key for r in rows} == {"invoice:42:paid"}  # webhook-id per endpoint
    assert {r.payload for r in rows} == {None}  # kept once, in the event
    assert {r.status for r in rows} == {"pending"}
    (ev,) = _events(five)
    assert (ev.event_type, ev.payload, ev.tenant, ev.fanned_out) == (
        "invoice.paid",
        {"invoice": 42, "region": "eu"},
        None,
        3,
    )
    assert published.deliveries == {r.name: r.id for r in rows}


def test_a_tenants_event_reaches_only_its_endpoints(five: Engine) -> None:
    make_endpoint(five, "acme-hook", event_types=["invoice.paid"], tenant="acme")
    acme = _publish(five, tenant="acme", idempotency_key="k1")
    globex = _publish(five, tenant="globex", idempotency_key="k1")  # same key, other tenant
    nobody = _publish(five, tenant="initech", idempotency_key="k1")
    assert list(acme.deliveries) == ["acme-hook"]
    assert list(globex.deliveries) == ["other-tenant"]
    assert nobody.deliveries == {} and nobody.created
    assert len({acme.event_id, globex.event_id, nobody.event_id}) == 3
    assert [e.fanned_out for e in _events(five)] == [1, 1, 0]  # reaching none is counted


def test_rollback_leaves_no_event_and_no_row(five: Engine) -> None:
    with pytest.raises(RuntimeError), Session(five) as session, session.begin():
        publish(session, event_type="invoice.paid", payload={}, idempotency_key="k")
        raise RuntimeError("the application's transaction fails")
    assert _rows(five) == [] and _events(five) == []


def test_publishing_again_adds_nothing_and_returns_the_first_result(five: Engine) -> None:
    first = _publish(five)
    make_endpoint(five, "late", event_types=["*"])  # subscribed after the event
    again = _publish(five, payload={"region": "eu", "invoice": 42})  # same JSON value
    assert again.event_id == first.event_id and again.deliveries == first.deliveries
    assert not again.created
    assert len(_rows(five)) == 3 and len(_events(five)) == 1
    with pytest.raises(EventConflict) as caught:
        _publish(five, payload={"invoice": 43})
    assert caught.value.existing_id == first.event_id
    assert isinstance(caught.value, IdempotencyConflict)


def test_a_key_held_by_an_enqueued_message_undoes_the_publish(five: Engine) -> None:
    with Session(five) as session, session.begin():
        enqueue(session, endpoint="by-pattern", event_type="x", payload={}, idempotency_key="k")
    # The caller catches the error and commits: nothing half-published is left.
    with (
        Session(five) as session,
        session.begin(),
        pytest.raises(IdempotencyConflict, match="by-pattern"),
    ):
        publish(session, event_type="invoice.paid", payload={}, idempotency_key="k")
    assert len(_rows(five)) == 1 and _events(five) == []


def test_a_spent_key_undoes_the_publish(five: Engine) -> None:
    with five.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO poller_spent_keys (endpoint_id, idempotency_key) "
                "SELECT id, 'k' FROM poller_endpoints WHERE name = 'by-name'"
            )
        )
    with pytest.raises(IdempotencyKeySpent, match="by-name"):
        _publish(five, idempotency_key="k")
    assert _rows(five) == [] and _events(five) == []


def test_disabled_endpoints_are_not_reached(five: Engine) -> None:
    with five.begin() as conn:
        set_enabled(conn, "by-name", False, "maintenance")
    assert sorted(_publish(five).deliveries) == ["by-filter", "by-pattern"]


def test_one_statement_fans_out_to_a_thousand_endpoints(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO poller_endpoints (name, url, secret, bucket, event_types) "
                "SELECT 'e' || i, 'http://127.0.0.1:9/' || i, 'whsec_x', i % 256, "
                "ARRAY['invoice.*'] FROM generate_series(1, 1000) AS i"
            )
        )
    statements: list[str] = []

    def count(*args: Any) -> None:
        statements.append(args[2])

    event.listen(engine, "before_cursor_execute", count)
    try:
        started = time.perf_counter()
        published = _publish(engine, payload={"blob": "x" * 4096})
        took = time.perf_counter() - started
    finally:
        event.remove(engine, "before_cursor_execute", count)
    assert len(published.deliveries) == 1000
    assert len([s for s in statements if "poller_" in s]) == 1
    print(f"1 event -> 1000 endpoints in {took * 1000:.1f} ms")
    with engine.connect() as conn:
        stored = conn.execute(
            text("SELECT count(*), count(payload), count(DISTINCT event_id) FROM poller_outbox")
        ).one()
    assert tuple(stored) == (1000, 0, 1)  # one payload, in the event


def test_ordered_events_wait_behind_their_key_per_endpoint(five: Engine) -> None:
    with Session(five) as session, session.begin():
        results = publish_many(
            session,
            [
                Event("invoice.paid", {"n": i, "region": "eu"}, f"k{i}", ordering_key="inv:1")
                for i in range(3)
            ],
        )
        publish(
            session,
            event_type="invoice.paid",
            payload={"n": 3, "region": "eu"},
            idempotency_key="k3",
            ordering_key="inv:1",
        )
    assert [len(r.deliveries) for r in results] == [3, 3, 3]
    statuses: dict[str, list[str]] = {}
    for row in _rows(five):
        statuses.setdefault(row.name, []).append(row.status)
    assert statuses == {name: ["pending", "waiting", "waiting", "waiting"] for name in statuses}
    assert len(statuses) == 3


def test_publish_many_dedupes_and_resolves_repeats(five: Engine) -> None:
    first = _publish(five, idempotency_key="old")
    with Session(five) as session, session.begin():
        results = publish_many(
            session,
            [
                Event("invoice.paid", {"region": "eu", "invoice": 42}, "old"),
                Event("invoice.paid", {"region": "eu"}, "new"),
                Event("invoice.paid", {"region": "eu"}, "new"),
                Event("customer.created", {}, "c", deliver_after=timedelta(hours=1)),
            ],
        )
    assert results[0] == first.__class__(first.event_id, first.deliveries, created=False)
    assert results[1] == results[2] and results[1].created
    assert sorted(results[1].deliveries) == ["by-filter", "by-name", "by-pattern"]
    assert sorted(results[3].deliveries) == ["by-name", "other-type"]
    with Session(five) as session, session.begin():
        with pytest.raises(EventConflict):
            publish_many(session, [Event("a", {}, "x"), Event("a", {"other": 1}, "x")])
        with pytest.raises(EventConflict):
            publish_many(session, [Event("b", {}, "y"), Event("invoice.paid", {"n": 9}, "old")])
    assert len(_events(five)) == 3  # the savepoint undid both failed batches


def test_bad_input_is_refused_before_any_write(five: Engine) -> None:
    cases: list[tuple[dict[str, Any], type[Exception]]] = [
        ({"tenant": ""}, InvalidTenant),
        ({"tenant": "a b"}, InvalidTenant),
        ({"tenant": "x" * 256}, InvalidTenant),
        ({"tenant": 5}, InvalidTenant),
        ({"event_type": "invoice.*"}, InvalidEventType),
        ({"payload": {"x": float("nan")}}, InvalidPayload),
        ({"payload": "\x00"}, InvalidPayload),
        ({"deliver_after": timedelta(weeks=99_999_999)}, EnqueueError),
        ({"deliver_after": timedelta(days=-1)}, EnqueueError),
    ]
    for fields, error in cases:
        with pytest.raises(error):
            _publish(five, **fields)
    with Session(five) as session, pytest.raises(InvalidPayload):
        publish_many(session, [Event("a", {"bad": {1, 2}}, "k")])
    assert _events(five) == []


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"event_types": ["invoice.**"]}, "pattern"),
        ({"event_types": ["*.paid"]}, "pattern"),
        ({"event_types": ["in voice"]}, "pattern"),
        ({"event_types": [""]}, "pattern"),
        ({"event_types": {"a": 1}}, "list"),
        ({"event_types": [f"t{i}" for i in range(101)]}, "at most"),
        ({"tenant": ""}, "tenant"),
        ({"tenant": "tab\there"}, "tenant"),
        ({"payload_filter": [1, 2]}, "object"),
        ({"payload_filter": "{not json"}, "JSON"),
        ({"payload_filter": {"x": float("inf")}}, "JSON"),
        ({"payload_filter": {"x": "a" * 5000}}, "bytes"),
        ({"payload_filter": {"x": "\x00"}}, "NUL"),
        ({"payload_filter": "[" * 100_000}, "bytes"),
        ({"payload_filter": "[" * 2000 + "]" * 2000}, "JSON"),  # too deep for the parser
        ({"payload_filter": {"x": "\ud800"}}, "lone surrogate"),
        ({"payload_filter": {"x": functools.reduce(lambda v, _: [v], range(200), [])}}, "deep"),
    ],
)
def test_bad_subscriptions_are_refused(
    engine: Engine, fields: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidSubscription, match=message):
        make_endpoint(engine, "x", **fields)


def test_subscriptions_change_and_clear(five: Engine) -> None:
    with five.begin() as conn:
        changed = update_endpoint(conn, "enqueue-only", event_types="invoice.paid, invoice.*")
        assert changed.event_types == ("invoice.paid", "invoice.*")
        update_endpoint(conn, "us-only", payload_filter=DEFAULT)
        update_endpoint(conn, "other-tenant", tenant=DEFAULT)
        update_endpoint(conn, "by-name", event_types=[])
    reached = sorted(_publish(five).deliveries)
    assert reached == ["by-filter", "by-pattern", "enqueue-only", "other-tenant", "us-only"]


def test_patterns_match_in_python_as_in_sql() -> None:
    assert subscribed(["invoice.*"], "invoice.paid")
    assert subscribed(["invoice.*"], "invoice.line.added")
    assert not subscribed(["invoice.*"], "invoice")
    assert not subscribed(["invoice.*"], "invoices.paid")
    assert subscribed(["*"], "anything")
    assert not subscribed([], "anything")


async def test_async_publish(aengine: AsyncEngine, five: Engine) -> None:
    async with AsyncSession(aengine) as session, session.begin():
        one = await publish_async(
            session, event_type="invoice.paid", payload={"region": "eu"}, idempotency_key="a"
        )
        ordered = await publish_async(
            session,
            event_type="invoice.paid",
            payload={},
            idempotency_key="b",
            ordering_key="o",
        )
        many = await publish_many_async(session, [Event("customer.created", {}, "c")])
    assert len(one.deliveries) == 3 and len(ordered.deliveries) == 2
    assert sorted(many[0].deliveries) == ["by-name", "other-type"]


def test_publishing_for_a_tenant_reads_only_its_endpoints(engine: Engine) -> None:
    """5,000 endpoints over 500 tenants: the plan reaches the tenant's through an index."""
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO poller_endpoints (name, url, secret, bucket, event_types, tenant) "
                "SELECT 'e' || i, 'http://127.0.0.1:9/' || i, 'whsec_x', i % 256, "
                "ARRAY['invoice.*'], 't' || (i % 500) FROM generate_series(1, 5000) AS i"
            )
        )
        conn.execute(text("ANALYZE poller_endpoints"))
    with engine.begin() as conn:  # the function's own statements, counted in its transaction
        conn.execute(text("SELECT poller_publish(event_type => 'invoice.paid', payload => '{}', "
                          "idempotency_key => 'k', tenant => 't7')"))  # fmt: skip
        scans = conn.execute(text(
            "SELECT seq_scan, idx_scan FROM pg_stat_xact_user_tables "
            "WHERE relname = 'poller_endpoints'")).one()  # fmt: skip
    assert scans.seq_scan == 0 and scans.idx_scan > 0, scans
    assert len(_publish(engine, tenant="t7", idempotency_key="k2").deliveries) == 10
