"""Payloads: the exact bytes the application serialized reach the receiver; typed values
encode as documented; only JSON objects are accepted at the top level."""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import uuid
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal

import pytest
from pydantic import BaseModel
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from poller import InvalidPayload, Message, NaiveDatetime, RawJSON, enqueue, enqueue_many
from poller.endpoints.registry import CreatedEndpoint
from poller.rules.payloads import serialise_payload
from tests.conftest import make_endpoint
from tests.integration import servers
from tests.integration.helpers import wait_for
from tests.integration.service_helpers import counts, fast_settings, running_poller


def _body(payload: object, **options: object) -> str:
    return serialise_payload(payload, 1 << 20, **options)  # type: ignore[arg-type]


async def test_the_receiver_gets_the_bytes_the_app_serialized(engine: Engine, db_url: str) -> None:
    bodies: list[bytes] = []

    async def capture(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await servers.read_request(reader)
        bodies.append(request.partition(b"\r\n\r\n")[2])
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()

    payload = {"order_id": 7, "customer": "Zoë ☃", "total": 1.0, "lines": [{"b": 2, "a": 1}]}
    async with servers.raw_server(capture) as url:
        make_endpoint(engine, "a", url=url)
        with Session(engine) as session, session.begin():
            enqueue(session, endpoint="a", event_type="e", payload=payload, idempotency_key="k")
        async with running_poller(db_url, fast_settings()):

            async def delivered() -> bool:
                return counts(engine) == {"delivered": 1}

            await wait_for(delivered)
    expected = '{"order_id":7,"customer":"Zoë ☃","total":1.0,"lines":[{"b":2,"a":1}]}'
    assert bodies == [expected.encode("utf-8")]  # key order, 1.0, raw UTF-8: all kept


def test_the_same_payload_in_another_key_order_is_the_same_message(
    engine: Engine, endpoint: CreatedEndpoint
) -> None:
    ids = []
    for payload in ({"a": 1, "b": 2}, {"b": 2, "a": 1}):
        with Session(engine) as session, session.begin():
            ids.append(
                enqueue(
                    session,
                    endpoint="billing",
                    event_type="e",
                    payload=payload,
                    idempotency_key="k",
                )
            )
        with Session(engine) as session, session.begin():
            ids += enqueue_many(session, [Message("billing", "e", payload, "k")])
    assert len(set(ids)) == 1


class Colour(enum.Enum):
    RED = "red"


@dataclasses.dataclass
class Line:
    sku: str
    price: Decimal


class Invoice(BaseModel):
    id: uuid.UUID
    paid_at: datetime
    total: Decimal


def test_typed_values_encode_as_documented() -> None:
    ident = uuid.UUID("7d4e2b1c-0000-4000-8000-000000000001")
    body = _body(
        {
            "at": datetime(2026, 11, 30, 9, 0, tzinfo=timezone(timedelta(hours=1))),
            "day": date(2026, 11, 30),
            "amount": Decimal("12.50"),
            "id": ident,
            "colour": Colour.RED,
            "line": Line("x-1", Decimal("3.10")),
        }
    )
    assert body == (
        '{"at":"2026-11-30T09:00:00+01:00","day":"2026-11-30","amount":"12.50",'
        '"id":"7d4e2b1c-0000-4000-8000-000000000001","colour":"red",'
        '"line":{"sku":"x-1","price":"3.10"}}'
    )
    model = Invoice(id=ident, paid_at=datetime(2026, 1, 2, tzinfo=UTC), total=Decimal("9.99"))
    assert _body(model) == (
        '{"id":"7d4e2b1c-0000-4000-8000-000000000001",'
        '"paid_at":"2026-01-02T00:00:00+00:00","total":"9.99"}'
    )
    assert _body(Line("y", Decimal("1"))) == '{"sku":"y","price":"1"}'


def test_a_json_default_hook_encodes_other_types_first() -> None:
    def sets_as_sorted_lists(value: object) -> object:
        if isinstance(value, set | frozenset):
            return sorted(value)
        raise TypeError(value)

    body = _body({"tags": {"b", "a"}, "n": Decimal("2")}, json_default=sets_as_sorted_lists)
    assert body == '{"tags":["a","b"],"n":"2"}'


def _nested(depth: int) -> dict[str, object]:
    payload: dict[str, object] = {}
    for _ in range(depth):
        payload = {"a": payload}
    return payload


@pytest.mark.parametrize(
    ("payload", "error"),
    [
        ({"at": datetime(2026, 1, 1)}, NaiveDatetime),
        ({"amount": Decimal("NaN")}, InvalidPayload),
        ({"tags": {1, 2}}, InvalidPayload),
        ({"blob": b"\x00"}, InvalidPayload),
        ([1, 2], InvalidPayload),
        ("hello", InvalidPayload),
        (None, InvalidPayload),
        (42, InvalidPayload),
        (_nested(5000), InvalidPayload),  # was Python's RecursionError
    ],
)
def test_what_cannot_be_sent_is_refused_before_any_write(payload: object, error: type) -> None:
    with pytest.raises(error):
        _body(payload)


def test_raw_json_is_kept_exactly_as_written() -> None:
    text = '{"total": 1e3, "name" : "Zo\\u00eb",\n "a":1}'
    assert _body(RawJSON(text)) == text
    for bad in ("[1, 2]", "null", "{nope", '{"x": "\\u0000"}', '{"a": NaN}', '{"a": -Infinity}',
                '{"x": "\\ud800"}', '{"\\uDFFF": 1}', '{"x": ["\\ude00\\ud83d"]}'):  # fmt: skip
        with pytest.raises(InvalidPayload):  # the surrogates were a DataError (jsonb refuses)
            _body(RawJSON(bad))
    for good in ('{"x": "\\ud83d\\ude00"}', '{"x": "\\\\ud800"}'):  # a pair; a backslash
        assert _body(RawJSON(good)) == good


def test_the_cli_sends_data_as_written(engine: Engine, endpoint: CreatedEndpoint) -> None:
    from click.testing import CliRunner
    from sqlalchemy import text

    from poller.cli import cli

    data = '{"total": 1e3, "b": 1, "a": 2}'
    url = engine.url.render_as_string(hide_password=False)
    result = CliRunner().invoke(
        cli,
        ["enqueue", "billing", "order.created", "--data", data, "--key", "k"],
        env={"POLLER_DATABASE_URL": url},
    )
    assert result.exit_code == 0, result.output
    with engine.connect() as conn:
        stored = conn.execute(text("SELECT CAST(payload AS text) FROM poller_outbox")).scalar_one()
    assert stored == data


def test_a_stored_payload_no_value_is_made_of_is_shown_as_its_text(engine: Engine) -> None:
    """A row written before enqueue checked the nesting, or by SQL: its message and its
    event are still shown, in the API's functions and the CLI (the dashboard's page:
    tests/integration/test_dashboard.py)."""
    from click.testing import CliRunner
    from sqlalchemy import text

    from poller import publish
    from poller.cli import cli
    from poller.operate import admin, replay

    make_endpoint(engine, "a", event_types=["e"])
    with Session(engine) as session, session.begin():
        enqueue(session, endpoint="a", event_type="e", payload={"n": 1}, idempotency_key="deep")
        publish(session, event_type="e", payload={"n": 2}, idempotency_key="big")
    deep, big = "[" * 3000 + "]" * 3000, '{"n": ' + "9" * 5000 + "}"
    with engine.begin() as conn:
        conn.execute(text("UPDATE poller_outbox SET payload = CAST(:p AS json) "
                          "WHERE idempotency_key = 'deep'"), {"p": deep})  # fmt: skip
        conn.execute(text("UPDATE poller_events SET payload = CAST(:p AS json)"), {"p": big})
        ids = dict(conn.execute(text("SELECT idempotency_key, id FROM poller_outbox")).all())
        event_id = conn.execute(text("SELECT id FROM poller_events")).scalar_one()
    with engine.connect() as conn:
        assert admin.message_detail(conn, ids["deep"])["payload"] == deep
        assert admin.message_detail(conn, ids["big"])["payload"] == big  # the event's
        assert replay.event_detail(conn, event_id)["payload"] == big
    url = engine.url.render_as_string(hide_password=False)
    shown = CliRunner().invoke(
        cli, ["admin", "show", str(ids["deep"])], env={"POLLER_DATABASE_URL": url}
    )
    assert shown.exit_code == 0, shown.output
