"""One conformance suite for every door into the outbox (tests/doors/doors.py): SQLAlchemy
sync and async, psycopg 3 sync and async, asyncpg, psycopg2, Django, SQL through psql, and
Node's pg. Each door must keep the same promises: a committed write is delivered once
and signed, a rolled-back one never exists, a repeat is the same message, a clash or a
spent key is refused, bad input is refused with nothing written — the same error class
(or, for SQL, its SQLSTATE) on every door."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

import pytest
from sqlalchemy import Engine, text

from poller import (
    EventConflict,
    IdempotencyConflict,
    IdempotencyKeySpent,
    InvalidIdempotencyKey,
    InvalidPayload,
    NaiveDatetime,
    PayloadTooLarge,
    UnknownEndpoint,
)
from tests.conftest import make_endpoint
from tests.doors.doors import DatabaseRefused, Door, enqueue, publish
from tests.integration.helpers import wait_for
from tests.integration.service_helpers import fast_settings, running_poller, running_receiver

ORDER = {"order": 42, "total": "19.99", "lines": [{"sku": "A-1", "qty": 2}]}


def _keys(engine: Engine) -> set[str]:
    with engine.connect() as conn:
        return set(
            conn.execute(
                text(
                    "SELECT idempotency_key FROM poller_outbox UNION ALL "
                    "SELECT idempotency_key FROM poller_events"
                )
            ).scalars()
        )


async def test_committed_is_delivered_once_signed_and_rolled_back_never_exists(
    door: Door, door_engine: Engine
) -> None:
    async with running_receiver() as (ra, url_a), running_receiver() as (rb, url_b):
        a = make_endpoint(door_engine, "a", url=url_a, event_types=["order.*"])
        b = make_endpoint(door_engine, "b", url=url_b, event_types=["order.created"])
        make_endpoint(door_engine, "c", url=url_b, event_types=["invoice.*"])
        ra.verifier.__init__([a.secret])
        rb.verifier.__init__([b.secret])
        await door.write([
            enqueue(endpoint="a", event_type="order.created", payload=ORDER,
                    idempotency_key="order:42:created"),
            publish(event_type="order.created", payload=ORDER, idempotency_key="order:42"),
        ])  # fmt: skip
        await door.write(
            [enqueue(endpoint="a", event_type="order.created", payload=ORDER,
                     idempotency_key="order:43:created"),
             publish(event_type="order.created", payload=ORDER, idempotency_key="order:43")],
            commit=False,
        )  # fmt: skip
        assert _keys(door_engine) == {"order:42:created", "order:42"}
        async with running_poller(door.db_url, fast_settings()):
            await wait_for(lambda: len(ra.applied) == 2 and len(rb.applied) == 1, timeout=20)
    assert ra.applied == {"order:42:created": 1, "order:42": 1}
    assert rb.applied == {"order:42": 1}
    assert ra.stats.bad_signatures == rb.stats.bad_signatures == 0
    assert ra.stats.duplicates == rb.stats.duplicates == 0


async def test_a_repeat_is_the_same_message_a_clash_and_a_spent_key_are_refused(
    door: Door, door_engine: Engine
) -> None:
    billing = make_endpoint(door_engine, "billing", event_types=["order.*"])
    first = enqueue(endpoint="billing", event_type="order.paid", payload=ORDER,
                    idempotency_key="k")  # fmt: skip
    event = publish(event_type="order.paid", payload=ORDER, idempotency_key="e")
    ids = await door.write([first, event])
    assert await door.write([first, event]) == ids
    with pytest.raises(IdempotencyConflict):
        await door.write([enqueue(**{**first.fields, "payload": {"order": 43}})])
    with pytest.raises(EventConflict):
        await door.write([publish(**{**event.fields, "payload": {"order": 43}})])
    with door_engine.begin() as conn:
        conn.execute(
            text("INSERT INTO poller_spent_keys (endpoint_id, idempotency_key) VALUES (:e, 's')"),
            {"e": billing.endpoint.id},
        )
    with pytest.raises(IdempotencyKeySpent):
        await door.write([enqueue(**{**first.fields, "idempotency_key": "s"})])
    assert _keys(door_engine) == {"k", "e"}


BAD: list[tuple[str, dict[str, Any], type[Exception] | tuple[type[Exception], ...]]] = [
    ("unknown endpoint", {"endpoint": "nowhere"}, UnknownEndpoint),
    ("oversized payload", {"payload": {"blob": "x" * 300_000}}, PayloadTooLarge),
    ("NUL in a key", {"idempotency_key": "a\x00b"}, (InvalidIdempotencyKey, DatabaseRefused)),
    # A Python door is handed the float; an SQL one the text an encoder allowing NaN
    # writes (tests/doors/doors.py), which is not JSON.
    ("NaN", {"payload": {"total": math.nan}}, InvalidPayload),
    ("key with a space", {"idempotency_key": "order 42"}, InvalidIdempotencyKey),
    # SQL has no naive timestamptz (a literal takes the session's zone): Python doors only
    ("naive deliver_after", {"deliver_after": datetime(2030, 1, 1)}, NaiveDatetime),
]


async def test_bad_input_is_refused_with_nothing_written(door: Door, door_engine: Engine) -> None:
    """Each case in a transaction of its own, after a good message in it: refused with
    the door's form of the same error, and the transaction writes nothing."""
    make_endpoint(door_engine, "billing")
    good = enqueue(endpoint="billing", event_type="order.paid", payload=ORDER,
                   idempotency_key="good")  # fmt: skip
    for case, bad, error in BAD:
        if error is NaiveDatetime and door.kind in ("psql", "node"):
            continue
        with pytest.raises(error) as refused:
            await door.write([good, enqueue(**{**good.fields, "idempotency_key": "bad", **bad})])
        if isinstance(refused.value, DatabaseRefused):  # PostgreSQL's own: text holds no NUL
            assert door.kind in ("psql", "node"), case
            assert refused.value.sqlstate in ("22021", "54000"), case
        assert _keys(door_engine) == set(), case


async def test_one_ordering_key_holds_commit_order_across_doors(
    engine: Engine, db_url: str
) -> None:
    """Messages of one key written through three doors (SQLAlchemy, psql, asyncpg), each
    commit after the one before, arrive in commit order; the text an SQL door passes is
    stored and sent byte for byte."""
    raw = '{"step": 2,   "note": "as written"}'
    async with running_receiver() as (receiver, url):
        make_endpoint(engine, "billing", url=url)
        ids = []
        for step, kind in enumerate(("sqlalchemy", "psql", "asyncpg", "psql", "sqlalchemy")):
            payload: Any = raw if kind == "psql" else {"step": step}
            [got] = await Door(kind, db_url).write([
                enqueue(endpoint="billing", event_type="order.changed", payload=payload,
                        idempotency_key=f"step:{step}", ordering_key="order:42"),
            ])  # fmt: skip
            ids.append(got)
        async with running_poller(db_url, fast_settings()):
            await wait_for(lambda: len(receiver.applied) == 5, timeout=20)
    assert ids == sorted(ids)
    assert (receiver.stats.ordered, receiver.stats.order_violations) == (5, 0)
    with engine.connect() as conn:
        stored = conn.execute(
            text("SELECT CAST(payload AS text) FROM poller_outbox WHERE idempotency_key = 'step:1'")
        ).scalar_one()
    assert stored == raw


async def test_a_payload_an_sql_door_could_not_check_is_never_sent_off_schema(
    engine: Engine, db_url: str
) -> None:
    """The database cannot check a catalog type's JSON Schema: an event published through
    SQL is checked by the poller before any send, and one that breaks it fails unsent."""
    from poller.outbox.catalog import define_event_type

    async with running_receiver() as (receiver, url):
        make_endpoint(engine, "billing", url=url, event_types=["order.paid"])
        with engine.begin() as conn:
            define_event_type(conn, "order.paid", schema={
                "type": "object", "required": ["total"],
                "properties": {"total": {"type": "number"}},
            })  # fmt: skip
        await Door("psql", db_url).write([
            publish(event_type="order.paid", payload={"total": 12.5}, idempotency_key="good"),
            publish(event_type="order.paid", payload={"total": "lots"}, idempotency_key="bad"),
        ])  # fmt: skip
        async with running_poller(db_url, fast_settings()):

            async def both_ended() -> bool:
                with engine.connect() as conn:
                    return conn.execute(text(
                        "SELECT count(*) FROM poller_outbox WHERE status IN ('delivered', 'failed')"
                    )).scalar_one() == 2  # fmt: skip

            await wait_for(both_ended, timeout=20)
    assert receiver.applied == {"good": 1}
    with engine.connect() as conn:
        bad = conn.execute(text(
            "SELECT o.status, o.attempts, a.kind, a.error_class, o.last_error "
            "FROM poller_outbox o JOIN poller_delivery_attempts a ON a.message_id = o.id "
            "WHERE o.idempotency_key = 'bad'"
        )).one()  # fmt: skip
    assert bad[:4] == ("failed", 1, "refusal", "PayloadInvalid")
    assert "does not match the schema of 'order.paid'" in bad.last_error
