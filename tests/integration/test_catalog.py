"""The event-type catalog (poller/outbox/catalog.py): a type with a JSON Schema takes only
payloads that match it, through publish, publish_many and the async ones; nothing of a
refused publish is left."""

from __future__ import annotations

import functools

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.orm import Session

from poller import Event, PayloadInvalid, define_event_type, publish, publish_async, publish_many
from poller.endpoints.registry import create_endpoint
from poller.errors import EventTypeNotFound, InvalidEventType, InvalidInput
from poller.outbox.catalog import get_event_type, list_event_types, remove_event_type

SCHEMA = {
    "type": "object",
    "required": ["order", "amount"],
    "properties": {"order": {"type": "integer"}, "amount": {"type": "number", "minimum": 0}},
}


def _counts(engine: Engine) -> tuple[int, int]:
    with engine.connect() as conn:
        return tuple(conn.execute(text(  # type: ignore[return-value]
            "SELECT (SELECT count(*) FROM poller_events), (SELECT count(*) FROM poller_outbox)"
        )).one())  # fmt: skip


@pytest.fixture
def catalog(engine: Engine) -> Engine:
    with engine.begin() as conn:
        create_endpoint(conn, "ledger", "https://ledger.example/in", event_types=["order.*"])
        define_event_type(conn, "order.paid", description="An order was paid.", schema=SCHEMA,
                          example={"order": 7, "amount": 12.5})  # fmt: skip
    return engine


def test_publish_takes_a_matching_payload_and_refuses_another(catalog: Engine) -> None:
    with Session(catalog) as session, session.begin():
        publish(session, event_type="order.paid", payload={"order": 7, "amount": 1},
                idempotency_key="ok")  # fmt: skip
        publish(session, event_type="order.shipped", payload={"anything": True},
                idempotency_key="untyped")  # no schema: not checked  # fmt: skip
    assert _counts(catalog) == (2, 2)
    for bad in ({"order": "7", "amount": 1}, {"order": 7}, {"order": 7, "amount": -1}):
        with Session(catalog) as session, session.begin():
            with pytest.raises(PayloadInvalid) as caught:
                publish(session, event_type="order.paid", payload=bad, idempotency_key="bad")
            session.commit()  # an application that goes on: nothing of it is kept
        assert caught.value.errors and "order.paid" in str(caught.value)
        assert _counts(catalog) == (2, 2), bad
    with Session(catalog) as session, session.begin():  # a batch: all or nothing
        with pytest.raises(PayloadInvalid, match="/order"):
            publish_many(session, [
                Event("order.paid", {"order": 8, "amount": 2}, "b1"),
                Event("order.paid", {"order": "x", "amount": 2}, "b2"),
            ])  # fmt: skip
        session.commit()
    assert _counts(catalog) == (2, 2)


async def test_publish_async_checks_too(catalog: Engine, db_url: str) -> None:
    engine = create_async_engine(db_url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        async with engine.begin() as conn:
            with pytest.raises(PayloadInvalid):
                await publish_async(conn, event_type="order.paid", payload={},
                                    idempotency_key="a")  # fmt: skip
    finally:
        await engine.dispose()
    assert _counts(catalog) == (0, 0)


def test_the_catalog_refuses_what_cannot_work(catalog: Engine) -> None:
    with catalog.begin() as conn:
        for kwargs in (
            {"schema": {"type": "nonsense"}},
            {"schema": []},
            {"schema": SCHEMA, "example": {"order": "x"}},
            {"schema": {"const": "\x00"}},
            {"description": "x" * 2001},
            {"schema": {"maximum": float("nan")}},  # these four were DataError or TypeError
            {"example": {"a": float("inf")}},
            {"schema": {"a": {1, 2}}},
            {"example": "x" * 300_000},
            {"deprecated": "false"},  # bool("false") is True
            # every publish of the type raised jsonschema's own error (nothing is fetched)
            {"schema": {"$ref": "https://schemas.example/order.json"}},
            {"schema": {"properties": {"n": {"$ref": "#/$defs/missing"}}}},
            {"schema": {"properties": {"n": {"$ref": "#money"}}}},  # no such $anchor
            {"schema": {"$ref": "#"}},  # goes round without end: a RecursionError
            {"schema": {"pattern": "^(?=a)"}},  # RE2 runs patterns: no lookaround
            # lone surrogates: jsonb refused them (a DataError), RE2 and UTF-8 too
            {"schema": {"const": "\ud800"}},
            {"schema": {"properties": {"\udc00": {}}}},
            {"schema": {"pattern": "^a"}, "example": "\ud800"},
            {"example": {"a": "\ud800"}},
            {"description": "\ud800"},
            # deeper than a payload may nest: the API's views of the type failed on it
            {"schema": {"properties": functools.reduce(lambda v, _: {"a": v}, range(300), {})}},
            {"example": functools.reduce(lambda v, _: {"a": v}, range(600), {})},
        ):
            with pytest.raises(InvalidInput):
                define_event_type(conn, "order.refunded", **kwargs)  # type: ignore[arg-type]
        with pytest.raises(InvalidEventType):
            define_event_type(conn, "bad type\x00", description="")
        changed = define_event_type(
            conn, "order.paid", description="now deprecated", deprecated=True
        )
        assert changed.schema is None and changed.deprecated  # replaced whole: no schema now
        assert [t.name for t in list_event_types(conn)] == ["order.paid"]
        remove_event_type(conn, "order.paid")
        with pytest.raises(EventTypeNotFound):
            get_event_type(conn, "order.paid")
        with pytest.raises(EventTypeNotFound):
            remove_event_type(conn, "nope\x00")


def test_the_cli_defines_shows_and_removes_event_types(
    engine: Engine, db_url: str, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    import json

    from click.testing import CliRunner

    from poller.cli import cli

    runner = CliRunner()

    def run(*args: str) -> tuple[int, str]:
        result = runner.invoke(cli, ["event-types", *args], env={"POLLER_DATABASE_URL": db_url})
        assert "Traceback" not in result.output
        return result.exit_code, result.output

    schema = tmp_path / "schema.json"
    schema.write_text('{"type": "object", "required": ["order"]}')
    code, out = run("define", "order.paid", "--description", "Paid", "--schema", f"@{schema}",
                    "--example", '{"order": 7}', "--json")  # fmt: skip
    assert code == 0 and json.loads(out)["schema"]["required"] == ["order"]
    code, out = run("show", "order.paid", "--json")
    assert code == 0 and json.loads(out)["example"] == {"order": 7}
    code, out = run("list")
    assert code == 0 and "order.paid" in out and "Paid" in out
    for args, said in (
        (("define", "x", "--schema", "{"), "not JSON"),
        (("define", "x", "--schema", "{}", "--example", '{"n": NaN}'), "NaN is not"),
        (("define", "x", "--schema", "@/no/such/file"), "cannot read"),
        (("define", "x", "--schema", "@a\x00b"), "cannot read"),
        (("define", "x", "--schema", '{"type": 5}'), "not a JSON Schema"),
        (("define", "x", "--schema", '{"required": ["n"]}', "--example", "{}"), "does not match"),
        (("define", "bad name", "--schema", "{}"), "must be letters"),
    ):
        code, out = run(*args)
        assert code == 2 and said in out and len(out.strip().splitlines()) == 1, (args, out)
    assert run("show", "nope") == (1, "error: no event type 'nope' in the catalog\n")
    assert run("remove", "order.paid")[0] == 0 and json.loads(run("list", "--json")[1]) == []


def test_a_stored_schema_that_cannot_be_followed_refuses_publishes_in_a_typed_error(
    catalog: Engine,
) -> None:
    """Stored before references were checked (or an anchor nobody defined): each publish of
    the type raised jsonschema's own exception; now a typed error, and nothing is kept."""
    with catalog.begin() as conn:
        conn.execute(text('UPDATE poller_event_types SET schema = \'{"$ref": "#nowhere"}\''))
    with Session(catalog) as session, session.begin():
        with pytest.raises(PayloadInvalid, match="cannot check it"):
            publish(session, event_type="order.paid", payload={}, idempotency_key="k")
        session.commit()
    assert _counts(catalog) == (0, 0)
