"""Enqueue API against a real database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from sqlalchemy import Engine, func, select, text, update
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from sqlalchemy.orm import Session

from poller import (
    EndpointDisabled,
    IdempotencyConflict,
    InvalidEventType,
    InvalidIdempotencyKey,
    InvalidPayload,
    Message,
    NaiveDatetime,
    PayloadTooLarge,
    UnknownEndpoint,
    enqueue,
    enqueue_async,
    enqueue_many,
    enqueue_many_async,
)
from poller.endpoints.registry import CreatedEndpoint
from poller.store.schema import endpoints, outbox
from tests.conftest import make_endpoint


def _enqueue(engine: Engine, **overrides: Any) -> int:
    fields: dict[str, Any] = {
        "endpoint": "billing",
        "event_type": "invoice.paid",
        "payload": {"invoice": 42},
        "idempotency_key": "invoice:42:paid",
    }
    fields.update(overrides)
    with Session(engine) as session, session.begin():
        return enqueue(session, **fields)


def _count(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(outbox)).scalar_one())


def test_enqueue_writes_a_pending_row_due_now(engine: Engine, endpoint: CreatedEndpoint) -> None:
    msg_id = _enqueue(engine)
    with engine.connect() as conn:
        row = conn.execute(select(outbox).where(outbox.c.id == msg_id)).one()
        now = conn.execute(select(func.now())).scalar_one()
    assert (row.status, row.attempts, row.payload) == ("pending", 0, {"invoice": 42})
    assert row.bucket == endpoint.endpoint.bucket
    assert row.max_attempts == 10
    assert row.next_attempt_at <= now


def test_same_key_same_payload_returns_the_existing_id(
    engine: Engine, endpoint: CreatedEndpoint
) -> None:
    assert _enqueue(engine) == _enqueue(engine)
    assert _count(engine) == 1


def test_same_key_different_payload_conflicts(engine: Engine, endpoint: CreatedEndpoint) -> None:
    first = _enqueue(engine)
    with pytest.raises(IdempotencyConflict) as info:
        _enqueue(engine, payload={"invoice": 43})
    assert info.value.existing_id == first
    with pytest.raises(IdempotencyConflict):
        _enqueue(engine, event_type="invoice.refunded")
    assert _count(engine) == 1


def test_same_key_on_another_endpoint_is_another_message(
    engine: Engine, endpoint: CreatedEndpoint
) -> None:
    make_endpoint(engine, "crm")
    assert _enqueue(engine) != _enqueue(engine, endpoint="crm")


def test_connection_as_well_as_session(engine: Engine, endpoint: CreatedEndpoint) -> None:
    with engine.begin() as conn:
        msg_id = enqueue(
            conn, endpoint="billing", event_type="e", payload={"v": [1, "two"]}, idempotency_key="k"
        )
    assert msg_id > 0 and _count(engine) == 1


def test_rolled_back_enqueue_leaves_no_row(engine: Engine, endpoint: CreatedEndpoint) -> None:
    with Session(engine) as session:
        session.begin()
        enqueue(session, endpoint="billing", event_type="e", payload={}, idempotency_key="k")
        session.rollback()
    assert _count(engine) == 0


def test_enqueue_never_commits(engine: Engine, endpoint: CreatedEndpoint) -> None:
    with Session(engine) as session:
        enqueue(session, endpoint="billing", event_type="e", payload={}, idempotency_key="k")
        assert _count(engine) == 0  # another connection does not see it yet
        session.commit()
    assert _count(engine) == 1


BAD_INPUTS = [
    ({"endpoint": "nope"}, UnknownEndpoint),
    ({"payload": {1, 2}}, InvalidPayload),
    ({"payload": {"x": float("nan")}}, InvalidPayload),
    ({"payload": [1, 2]}, InvalidPayload),  # the top level is an object
    ({"payload": None}, InvalidPayload),
    ({"payload": "hello"}, InvalidPayload),
    ({"payload": {"x": float("inf")}}, InvalidPayload),
    ({"payload": {"x": "\u0000"}}, InvalidPayload),
    ({"payload": {"x": "\ud800"}}, InvalidPayload),
    ({"payload": {"x": "x" * (256 * 1024)}}, PayloadTooLarge),
    ({"idempotency_key": ""}, InvalidIdempotencyKey),
    ({"idempotency_key": "k" * 256}, InvalidIdempotencyKey),
    ({"idempotency_key": "a\nb"}, InvalidIdempotencyKey),
    ({"idempotency_key": "two words"}, InvalidIdempotencyKey),
    ({"idempotency_key": 42}, InvalidIdempotencyKey),
    ({"idempotency_key": "."}, InvalidIdempotencyKey),
    ({"idempotency_key": ".."}, InvalidIdempotencyKey),
    ({"event_type": ""}, InvalidEventType),
    ({"event_type": "a\x00b"}, InvalidEventType),
    ({"event_type": "invoice paid"}, InvalidEventType),
    ({"event_type": ".hidden"}, InvalidEventType),
    ({"deliver_after": datetime(2030, 1, 1)}, NaiveDatetime),
    ({"deliver_after": timedelta(seconds=-1)}, ValueError),
    ({"deliver_after": "tomorrow"}, ValueError),
    ({"max_attempts": 0}, ValueError),
    ({"max_attempts": 2**40}, ValueError),  # past the column's integer: was a DataError
    ({"deliver_after": datetime.max.replace(tzinfo=UTC)}, ValueError),  # 100 years, as a delay
    # 1 BC in UTC: stored, and then no reader could load the message (a DataError)
    ({"deliver_after": datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=14)))}, ValueError),
]


@pytest.mark.parametrize(("override", "error"), BAD_INPUTS)
def test_bad_input_raises_its_error_and_writes_nothing(
    engine: Engine, endpoint: CreatedEndpoint, override: dict[str, Any], error: type[Exception]
) -> None:
    with pytest.raises(error):
        _enqueue(engine, **override)
    assert _count(engine) == 0


def test_payload_at_the_limit_is_accepted(engine: Engine, endpoint: CreatedEndpoint) -> None:
    body = "x" * (256 * 1024 - 8)  # {"v":""} makes it exactly the limit
    _enqueue(engine, payload={"v": body})
    assert _count(engine) == 1


def test_disabled_endpoint_is_refused(engine: Engine, endpoint: CreatedEndpoint) -> None:
    with engine.begin() as conn:
        conn.execute(update(endpoints).values(enabled=False, disabled_reason="410 Gone"))
    with pytest.raises(EndpointDisabled, match="410 Gone"):
        _enqueue(engine)
    assert _count(engine) == 0


def test_sql_metacharacters_are_data(engine: Engine, endpoint: CreatedEndpoint) -> None:
    nasty = "x'); DROP TABLE poller_outbox; --"
    msg_id = _enqueue(engine, payload={nasty: nasty}, idempotency_key="k';--")
    with engine.connect() as conn:
        row = conn.execute(select(outbox).where(outbox.c.id == msg_id)).one()
    assert (row.payload, row.idempotency_key) == ({nasty: nasty}, "k';--")
    with pytest.raises(InvalidEventType):  # not a name: refused, never written
        _enqueue(engine, event_type=nasty, idempotency_key="k2")


def test_deliver_after_delays_on_the_database_clock(
    engine: Engine, endpoint: CreatedEndpoint
) -> None:
    at = datetime(2031, 5, 4, 3, 2, 1, tzinfo=UTC)
    absolute = _enqueue(engine, idempotency_key="a", deliver_after=at)
    relative = _enqueue(engine, idempotency_key="r", deliver_after=timedelta(hours=1))
    with engine.connect() as conn:
        due = dict(
            conn.execute(
                text(
                    "SELECT id, next_attempt_at - now() > interval '59 minutes' FROM poller_outbox"
                )
            ).all()
        )
        stored = conn.execute(select(outbox.c.next_attempt_at).where(outbox.c.id == absolute))
        assert stored.scalar_one() == at
    assert due[relative] is True


def test_max_attempts_explicit_then_endpoint_then_default(engine: Engine) -> None:
    make_endpoint(engine, "capped", max_attempts=3)
    make_endpoint(engine, "plain")
    ids = [
        _enqueue(engine, endpoint="capped", idempotency_key="a", max_attempts=7),
        _enqueue(engine, endpoint="capped", idempotency_key="b"),
        _enqueue(engine, endpoint="plain", idempotency_key="c"),
    ]
    with engine.connect() as conn:
        budget = dict(conn.execute(select(outbox.c.id, outbox.c.max_attempts)).all())
    assert [budget[i] for i in ids] == [7, 3, 10]


def test_max_attempts_default_comes_from_settings(
    engine: Engine, endpoint: CreatedEndpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    from poller.settings import default_settings

    monkeypatch.setenv("POLLER_MAX_ATTEMPTS", "4")
    default_settings.cache_clear()
    with engine.connect() as conn:
        msg_id = _enqueue(engine)
        assert (
            conn.execute(select(outbox.c.max_attempts).where(outbox.c.id == msg_id)).scalar() == 4
        )


# --- enqueue_many --------------------------------------------------------------


def _messages(n: int, endpoint: str = "billing", offset: int = 0) -> list[Message]:
    return [Message(endpoint, "order.created", {"n": i}, f"order:{i}") for i in range(offset, n)]


def test_enqueue_many_returns_ids_in_order(engine: Engine, endpoint: CreatedEndpoint) -> None:
    with Session(engine) as session, session.begin():
        ids = enqueue_many(session, _messages(500))
    with engine.connect() as conn:
        keys = dict(conn.execute(select(outbox.c.id, outbox.c.idempotency_key)).all())
    assert [keys[i] for i in ids] == [f"order:{i}" for i in range(500)]


def test_enqueue_many_is_idempotent_with_existing_and_repeated_keys(
    engine: Engine, endpoint: CreatedEndpoint
) -> None:
    with Session(engine) as session, session.begin():
        first = enqueue_many(session, _messages(10))
    batch = _messages(15, offset=5) + _messages(7, offset=6)  # overlaps both ways
    with Session(engine) as session, session.begin():
        second = enqueue_many(session, batch)
    assert second[:5] == first[5:10]
    assert second[15 - 5 :] == first[6:7]
    assert _count(engine) == 15


def test_enqueue_many_conflict_leaves_none_of_its_rows(
    engine: Engine, endpoint: CreatedEndpoint
) -> None:
    _enqueue(engine, idempotency_key="order:3", payload={"different": True}, event_type="x")
    # The caller catches the error and commits: the savepoint took this call's rows back.
    with Session(engine) as session, session.begin(), pytest.raises(IdempotencyConflict):
        enqueue_many(session, _messages(10))
    assert _count(engine) == 1


def test_enqueue_many_conflict_within_the_batch(engine: Engine, endpoint: CreatedEndpoint) -> None:
    batch = [*_messages(3), Message("billing", "order.created", {"n": 99}, "order:1")]
    with Session(engine) as session, session.begin(), pytest.raises(IdempotencyConflict):
        enqueue_many(session, batch)
    assert _count(engine) == 0


def test_enqueue_many_validates_everything_before_writing(
    engine: Engine, endpoint: CreatedEndpoint
) -> None:
    with Session(engine) as session, session.begin():
        with pytest.raises(UnknownEndpoint):
            enqueue_many(session, [*_messages(5), *_messages(1, endpoint="ghost")])
        with pytest.raises(InvalidPayload):
            enqueue_many(session, [*_messages(5), Message("billing", "e", {1j}, "k")])
    assert _count(engine) == 0


# --- async ---------------------------------------------------------------------


async def test_async_variants(aengine: AsyncEngine, engine: Engine) -> None:
    make_endpoint(engine)
    async with AsyncSession(aengine) as session, session.begin():
        one = await enqueue_async(
            session, endpoint="billing", event_type="e", payload={"a": 1}, idempotency_key="one"
        )
        many = await enqueue_many_async(session, _messages(20))
    async with aengine.begin() as conn:
        again = await enqueue_async(
            conn, endpoint="billing", event_type="e", payload={"a": 1}, idempotency_key="one"
        )
        with pytest.raises(IdempotencyConflict):
            await enqueue_many_async(conn, [Message("billing", "e", {"a": 2}, "one")])
    assert one == again and len(set(many)) == 20
    assert _count(engine) == 21
