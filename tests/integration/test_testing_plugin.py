"""The pytest plugin applications use (poller/testing.py), used here as an application would."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from poller import Message, enqueue, enqueue_many, publish
from poller.endpoints.registry import CreatedEndpoint
from poller.testing import Outbox, contains
from tests.conftest import make_endpoint


@pytest.fixture
def poller_db(engine: Engine, endpoint: CreatedEndpoint) -> Iterator[Session]:
    """The test's own session; never committed, as in an application's test suite."""
    with Session(engine) as session:
        enqueue(session, endpoint="billing", event_type="before", payload={}, idempotency_key="old")
        session.flush()
        yield session
        session.rollback()


def test_it_sees_what_the_code_under_test_enqueued_in_the_open_transaction(
    poller_db: Session, outbox: Outbox
) -> None:
    enqueue(
        poller_db,
        endpoint="billing",
        event_type="invoice.paid",
        payload={"invoice": 42, "lines": [{"sku": "a"}, {"sku": "b"}]},
        idempotency_key="invoice:42:paid",
    )
    found = outbox.assert_enqueued(
        "invoice.paid", endpoint="billing", payload_contains={"lines": [{"sku": "b"}]}
    )
    assert found.idempotency_key == "invoice:42:paid" and found.payload["invoice"] == 42
    assert [m.event_type for m in outbox.messages()] == ["invoice.paid"]  # not "before"


def test_a_missing_message_fails_with_what_was_enqueued(poller_db: Session, outbox: Outbox) -> None:
    outbox.assert_nothing_enqueued()
    enqueue_many(poller_db, [Message("billing", "invoice.paid", {"invoice": 1}, "k1")])
    with pytest.raises(AssertionError, match=r"found 0\. Enqueued in this test:\n  billing"):
        outbox.assert_enqueued("invoice.paid", payload_contains={"invoice": 2})
    with pytest.raises(AssertionError, match="found 1"):
        outbox.assert_enqueued("invoice.paid", count=2)
    with pytest.raises(AssertionError, match="expected nothing"):
        outbox.assert_nothing_enqueued()


def test_containment_is_like_postgres() -> None:
    assert contains({"a": {"b": 1, "c": 2}}, {"a": {"b": 1}})
    assert contains([1, 2, 3], [3, 1]) and not contains([1], [2])
    assert not contains({"a": 1}, {"a": "1"}) and not contains({"a": 1}, {"b": 1})


def test_a_published_event_shows_once_per_endpoint_reached(
    engine: Engine, poller_db: Session, outbox: Outbox
) -> None:
    make_endpoint(engine, "crm", event_types=["invoice.*"])
    make_endpoint(engine, "audit", event_types=["*"])
    publish(poller_db, event_type="invoice.paid", payload={"invoice": 7}, idempotency_key="i7")
    found = sorted((m.endpoint, m.payload["invoice"]) for m in outbox.messages())
    assert found == [("audit", 7), ("crm", 7)]
    outbox.assert_enqueued("invoice.paid", endpoint="crm", payload_contains={"invoice": 7})


def test_it_reads_through_a_psycopg_connection_as_well(db_url: str, engine: Engine) -> None:
    """An application on psycopg (or psycopg2, or Django's connection) hands its own."""
    import psycopg

    from poller.store.db import libpq_url

    make_endpoint(engine, "billing")
    with psycopg.connect(libpq_url(db_url)) as conn:
        recording = Outbox(conn)
        enqueue(conn, endpoint="billing", event_type="invoice.paid", payload={"invoice": 7},
                idempotency_key="invoice:7:paid")  # fmt: skip
        assert recording.assert_enqueued("invoice.paid", payload_contains={"invoice": 7})
        conn.rollback()
