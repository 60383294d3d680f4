"""Fan-out end to end: published events delivered by running pollers, replay, the CLI,
retention and the migration (poller/outbox/publish.py, poller/operate/replay.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from alembic import command
from click.testing import CliRunner
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from poller import Event, enqueue, publish, publish_many
from poller.cli import cli
from poller.endpoints.registry import create_endpoint, new_secret
from poller.local.receiver import Faults, Receiver
from poller.operate.replay import replay
from poller.service.maintenance import Purger
from poller.store import migrate
from poller.store.db import async_engine, sync_engine
from tests.conftest import make_endpoint
from tests.integration.helpers import wait_for
from tests.integration.service_helpers import fast_settings, running_poller


@contextlib.asynccontextmanager
async def receiver_for(
    engine: Engine, name: str, faults: Faults | None = None, **subscription: Any
) -> AsyncIterator[Receiver]:
    """A receiver of its own for endpoint ``name`` (made here), checking its signatures."""
    secret = new_secret()
    receiver = Receiver(keys=[secret], faults=faults)
    port = await receiver.start()
    try:
        url = f"http://127.0.0.1:{port}/{name}"
        make_endpoint(engine, name, url=url, secret=secret, **subscription)
        yield receiver
    finally:
        await receiver.stop()


def _applied(*receivers: Receiver, n: int) -> Any:
    async def check() -> bool:
        return all(r.stats.applied >= n for r in receivers)

    return check


async def test_each_subscriber_gets_the_event_signed_with_its_own_secret(
    engine: Engine, db_url: str
) -> None:
    async with (
        receiver_for(engine, "a", event_types=["order.*"]) as a,
        receiver_for(engine, "b", event_types=["order.created"], tenant="acme") as b,
        receiver_for(engine, "c", event_types=["*"], payload_filter={"vip": True}) as c,
        running_poller(db_url, fast_settings()),
    ):
        with Session(engine) as session, session.begin():
            publish(session, event_type="order.created", payload={"n": 1}, idempotency_key="o1")
            publish(
                session,
                event_type="order.created",
                payload={"n": 2, "vip": True},
                idempotency_key="o2",
            )
            publish(
                session,
                event_type="order.created",
                payload={"n": 3},
                idempotency_key="o3",
                tenant="acme",
            )
        await wait_for(_applied(a, n=2), timeout=10)
        await wait_for(_applied(b, c, n=1), timeout=10)
    assert (a.stats.applied, b.stats.applied, c.stats.applied) == (2, 1, 1)
    assert a.stats.bad_signatures == b.stats.bad_signatures == c.stats.bad_signatures == 0
    assert set(a.applied) == {"o1", "o2"} and set(b.applied) == {"o3"} and set(c.applied) == {"o2"}


async def test_one_subscriber_down_does_not_delay_the_others(engine: Engine, db_url: str) -> None:
    async with (
        receiver_for(engine, "up1", event_types=["*"]) as up1,
        receiver_for(engine, "up2", event_types=["*"]) as up2,
        receiver_for(engine, "down", Faults(fail_rate=1.0, status=503), event_types=["*"]) as down,
    ):
        settings = fast_settings(circuit_failures=5, circuit_cooldown=60, circuit_cooldown_max=60)
        async with running_poller(db_url, settings):
            with Session(engine) as session, session.begin():
                publish_many(session, [Event("tick", {"n": i}, f"t{i}") for i in range(300)])
            began = time.monotonic()

            async def circuit_open() -> bool:
                with engine.connect() as conn:
                    state = conn.execute(
                        text(
                            "SELECT h.state FROM poller_endpoint_health h JOIN poller_endpoints e"
                            " ON e.id = h.endpoint_id WHERE e.name = 'down'"
                        )
                    ).scalar_one()
                return bool(state == "open")

            await wait_for(circuit_open, timeout=20)
            when_open = down.stats.received
            await wait_for(_applied(up1, up2, n=300), timeout=20)
            took = time.monotonic() - began
    # What it got before its circuit opened depends on how many claims ran before the
    # completion with its fifth failure committed (a race with the machine's load);
    # once open, only what was already in flight (at most concurrency, 64) reaches it.
    assert down.stats.applied == 0 and down.stats.received - when_open <= 64
    assert down.stats.received < 100  # of its 300
    assert up1.stats.duplicates == up2.stats.duplicates == 0
    assert took < 10, took
    with engine.connect() as conn:
        waiting = conn.execute(
            text(
                "SELECT count(*) FROM poller_outbox o JOIN poller_endpoints e "
                "ON e.id = o.endpoint_id WHERE e.name = 'down' AND o.status = 'pending'"
            )
        ).scalar_one()
    assert waiting == 300  # held by the open circuit, none failed


def test_replay_sends_earlier_events_to_a_late_endpoint(engine: Engine) -> None:
    make_endpoint(engine, "early", event_types=["invoice.*"])
    with Session(engine) as session, session.begin():
        publish_many(
            session,
            [Event("invoice.paid", {"n": i}, f"i{i}", ordering_key=f"k{i % 2}") for i in range(6)]
            + [Event("customer.created", {}, "c1")],
        )
    make_endpoint(engine, "late", event_types=["invoice.*"])
    with Session(engine) as session, session.begin():  # holds key i0 on "late" already
        enqueue(session, endpoint="late", event_type="x", payload={}, idempotency_key="i0")
    since = datetime.now(UTC) - timedelta(hours=1)
    dry = replay(engine, "late", since=since, dry_run=True)
    assert (dry.events, dry.queued, dry.taken, dry.dry_run) == (6, 5, 1, True)
    assert _statuses(engine, "late") == {"pending": 1}  # the dry run wrote nothing
    done = replay(engine, "late", since=since, batch=2)
    assert (done.events, done.queued, done.taken, done.batches) == (6, 5, 1, 3)
    assert _statuses(engine, "late") == {"pending": 3, "waiting": 3}  # in line per key
    again = replay(engine, "late", since=since)
    assert (again.queued, again.resent, again.open) == (0, 0, 5)
    with engine.begin() as conn:
        conn.execute(text("UPDATE poller_outbox SET status = 'delivered', delivered_at = now()"))
        conn.execute(text("DELETE FROM poller_ordering_keys"))
    resent = replay(engine, "late", since=since, event_type="invoice.paid")
    assert (resent.events, resent.resent) == (6, 5)
    with engine.connect() as conn:
        outcomes = conn.execute(
            text("SELECT outcome, count(*) FROM poller_delivery_attempts GROUP BY 1")
        ).all()
    assert dict(outcomes) == {"replayed": 5}
    assert replay(engine, "late", since=since, until=since + timedelta(minutes=1)).events == 0


async def test_replay_of_10000_events_in_batches_while_pollers_run(
    engine: Engine, db_url: str
) -> None:
    make_endpoint(engine, "live", event_types=["*"])
    with Session(engine) as session, session.begin():
        publish_many(session, [Event("e", {"n": i}, f"e{i}") for i in range(10_000)])
    with engine.begin() as conn:  # "live" had them all: only the replay has work to do
        conn.execute(text("UPDATE poller_outbox SET status = 'delivered', delivered_at = now()"))
    async with (
        receiver_for(engine, "late", event_types=["e"], max_in_flight=128) as late,
        running_poller(db_url, fast_settings()),
    ):
        first_receipt: list[float] = []
        done: list[Any] = []

        def run() -> None:
            done.append(replay(engine, "late", since=datetime.now(UTC) - timedelta(hours=1)))
            done.append(time.monotonic())

        worker = threading.Thread(target=run)
        worker.start()

        async def started() -> bool:
            if late.stats.applied and not first_receipt:
                first_receipt.append(time.monotonic())
            return bool(first_receipt) or not worker.is_alive()

        await wait_for(started, timeout=60)
        await asyncio.to_thread(worker.join, 60)
        await wait_for(_applied(late, n=10_000), timeout=60)
    result, finished = done
    assert (result.events, result.queued, result.batches) == (10_000, 10_000, 20)
    assert first_receipt[0] < finished  # delivered while the replay still ran
    assert late.stats.applied == 10_000 and late.stats.duplicates == 0
    assert _statuses(engine, "live") == {"delivered": 10_000}  # not touched


async def test_retention_purges_events_no_row_references(engine: Engine, db_url: str) -> None:
    make_endpoint(engine, "a", event_types=["*"])
    with Session(engine) as session, session.begin():
        publish(session, event_type="kept", payload={}, idempotency_key="k1")
        publish(session, event_type="nobody", payload={}, idempotency_key="k2", tenant="x")
    aengine = async_engine(db_url)
    try:
        purger = Purger(aengine, delivered_age=3600, failed_age=3600, events_age=0.001)
        await asyncio.sleep(0.01)  # older than the 1 ms retention: time must pass
        assert await purger.run_once() == 1
    finally:
        await aengine.dispose()
    with engine.connect() as conn:
        left = conn.execute(text("SELECT event_type FROM poller_events")).scalars().all()
    assert left == ["kept"]  # still referenced by its row


def _statuses(engine: Engine, endpoint: str) -> dict[str, int]:
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT o.status, count(*) FROM poller_outbox o JOIN poller_endpoints e "
                "ON e.id = o.endpoint_id WHERE e.name = :name GROUP BY 1"
            ),
            {"name": endpoint},
        )
        return dict(rows.all())  # type: ignore[arg-type]


# --- CLI ---------------------------------------------------------------------------


@pytest.fixture
def run(db_url: str):  # type: ignore[no-untyped-def]
    def invoke(*args: str) -> tuple[int, str, str]:
        result = CliRunner().invoke(
            cli, list(args), env={"POLLER_DATABASE_URL": db_url}, catch_exceptions=False
        )
        return result.exit_code, result.stdout, result.stderr

    return invoke


def test_the_operator_story_through_the_cli(run, engine: Engine) -> None:  # type: ignore[no-untyped-def]
    url = "http://127.0.0.1:9/hook"
    assert run("endpoints", "add", "acme-eu", url, "--events", "invoice.*,customer.created",
               "--tenant", "acme", "--filter", '{"region": "eu"}')[0] == 0  # fmt: skip
    assert run("endpoints", "add", "audit", url, "--events", "*", "--tenant", "acme")[0] == 0
    shown = json.loads(run("endpoints", "show", "acme-eu", "--json")[1])
    assert shown["event_types"] == ["invoice.*", "customer.created"]
    assert (shown["tenant"], shown["payload_filter"]) == ("acme", {"region": "eu"})
    assert "invoice.*, customer.created" in run("endpoints", "show", "acme-eu")[1]
    code, out, _ = run("publish", "invoice.paid", "--data", '{"region": "eu", "n": 1}',
                       "--key", "inv-1", "--tenant", "acme", "--json")  # fmt: skip
    published = json.loads(out)
    assert code == 0 and sorted(published["deliveries"]) == ["acme-eu", "audit"]
    code, out, _ = run("publish", "invoice.paid", "--data", '{"region": "eu", "n": 1}',
                       "--key", "inv-1", "--tenant", "acme")  # fmt: skip
    assert code == 0 and "published before" in out
    assert "no endpoint" in run("publish", "x", "--data", "{}", "--key", "k")[1]
    event = json.loads(run("admin", "show", "--event", str(published["event_id"]), "--json")[1])
    assert [d["endpoint"] for d in event["deliveries"]] == ["acme-eu", "audit"]
    assert event["payload"] == {"region": "eu", "n": 1}
    assert "acme-eu" in run("admin", "show", "--event", str(published["event_id"]))[1]
    message = json.loads(run("admin", "show", str(published["deliveries"]["audit"]), "--json")[1])
    assert message["payload"] == {"region": "eu", "n": 1}  # the event's, shown for its row
    assert (
        run("endpoints", "add", "late", url, "--events", "invoice.paid", "--tenant", "acme")[0] == 0
    )
    code, out, _ = run("admin", "replay", "--endpoint", "late", "--since", "1h", "--dry-run",
                       "--json")  # fmt: skip
    assert code == 0 and json.loads(out)["queued"] == 1
    code, out, _ = run("admin", "replay", "--endpoint", "late", "--since", "1h", "--yes")
    assert code == 0 and "1 new" in out
    assert run("admin", "replay", "--endpoint", "audit", "--since", "1m", "--until", "2m")[0] == 2
    assert run("admin", "replay", "--endpoint", "nope", "--since", "1h", "--yes")[0] == 1
    assert run("admin", "show", "--event", "999999")[0] == 1
    stats = json.loads(run("admin", "stats", "--json")[1])
    assert (stats["events_last_day"], stats["events_unrouted_last_day"]) == (2, 1)
    assert run("endpoints", "update", "audit", "--events", "", "--tenant", "")[0] == 0
    assert json.loads(run("endpoints", "show", "audit", "--json")[1])["event_types"] == []


@pytest.mark.parametrize(
    "args",
    [
        ("endpoints", "add", "x", "http://127.0.0.1:9/", "--filter", "[1]"),
        ("endpoints", "add", "x", "http://127.0.0.1:9/", "--filter", "{bad"),
        ("endpoints", "add", "x", "http://127.0.0.1:9/", "--events", "a.**"),
        ("endpoints", "add", "x", "http://127.0.0.1:9/", "--tenant", "a b"),
        ("publish", "t", "--data", "{}", "--key", "k", "--tenant", ""),
        ("publish", "t.*", "--data", "{}", "--key", "k"),
        ("publish", "t", "--data", "not json", "--key", "k"),
        ("publish", "t", "--data", "{}", "--key", "k", "--deliver-after", "99999999w"),
        ("publish", "t", "--data", "{}", "--key", "k", "--deliver-after", "5300w"),
        ("admin", "replay", "--endpoint", "x", "--since", "99999999w", "--yes"),
        ("admin", "replay", "--endpoint", "x", "--since", "99999999999999w", "--yes"),
        ("admin", "replay", "--endpoint", "x", "--since", "1h", "--batch", "0", "--yes"),
        ("admin", "show", "--event", "1", "7"),
    ],
)
def test_bad_cli_input_is_one_line_and_exit_2(run, args: tuple[str, ...]) -> None:  # type: ignore[no-untyped-def]
    code, out, err = run(*args)
    assert code == 2, (out, err)
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1].lower().startswith("error"), err


# --- migration ---------------------------------------------------------------------


def test_upgrade_keeps_enqueue_and_downgrade_keeps_published_rows(empty_db_url: str) -> None:
    config = migrate.alembic_config(empty_db_url)
    command.upgrade(config, "0007")
    engine = sync_engine(empty_db_url)
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO poller_endpoints (name, url, secret, bucket) "
                    "VALUES ('old', 'http://127.0.0.1:9/', 'whsec_x', 1)"
                )
            )
            conn.execute(
                text(
                    "INSERT INTO poller_outbox (endpoint_id, bucket, event_type, payload, "
                    "idempotency_key, max_attempts) SELECT id, 1, 'e', '{\"a\": 1}', 'k0', 5 "
                    "FROM poller_endpoints"
                )
            )
        migrate.upgrade(empty_db_url)
        with Session(engine) as session, session.begin():
            enqueue(session, endpoint="old", event_type="e", payload={"b": 2}, idempotency_key="k1")
            assert (
                publish(session, event_type="e", payload={}, idempotency_key="p").deliveries == {}
            )
        with engine.begin() as conn:
            create_endpoint(conn, "new", "http://127.0.0.1:9/", event_types=["*"])
        with Session(engine) as session, session.begin():
            publish(session, event_type="e", payload={"c": 3}, idempotency_key="p2")
        command.downgrade(config, "0007")
        with engine.connect() as conn:
            rows = conn.execute(
                text("SELECT idempotency_key, CAST(payload AS text) FROM poller_outbox ORDER BY id")
            ).all()
        assert [(k, json.loads(p)) for k, p in rows] == [
            ("k0", {"a": 1}),
            ("k1", {"b": 2}),
            ("p2", {"c": 3}),  # the event's payload, copied into its row
        ]
        migrate.upgrade(empty_db_url)
        assert migrate.current_revision(empty_db_url) == migrate.head_revision()
    finally:
        engine.dispose()


async def test_positions_follow_the_events_order_through_a_disabled_spell_and_a_replay(
    engine: Engine, db_url: str
) -> None:
    """Events missed while the endpoint was disabled get their rows from a replay, after
    live ones went out; ended rows are sent again beside them. Whatever the order on
    the wire, each message's webhook-ordering-seq follows its event's order, so a
    receiver that applies only growing positions per key ends at the newest event."""
    from poller.endpoints.registry import set_enabled

    seen: list[tuple[int, int]] = []  # (position, event's n) as received

    class Recording(Receiver):
        def _apply(self, key: str, body: bytes, now: float, headers: Any = None) -> None:
            seen.append((int(headers[b"webhook-ordering-seq"]), json.loads(body)["n"]))
            super()._apply(key, body, now, headers)

    def emit(*ns: int) -> None:
        with Session(engine) as session, session.begin():
            for n in ns:
                publish(session, event_type="order.changed", payload={"n": n},
                        idempotency_key=f"o:{n}", ordering_key="order-1")  # fmt: skip

    def enabled(on: bool) -> None:
        with Session(engine) as session, session.begin():
            set_enabled(session, "shop", on)

    receiver = Recording()
    port = await receiver.start()
    since = datetime.now(UTC) - timedelta(minutes=1)
    try:
        make_endpoint(engine, "shop", url=f"http://127.0.0.1:{port}/", event_types=["order.*"])
        async with running_poller(db_url, fast_settings()):
            emit(0, 1)
            await wait_for(_applied(receiver, n=2))
            enabled(False)
            emit(2, 3)  # no row on a disabled endpoint
            enabled(True)
            emit(4)

            async def three_delivered() -> bool:
                return _statuses(engine, "shop") == {"delivered": 3}

            await wait_for(three_delivered)
            done = replay(engine, "shop", since=since)
            assert (done.queued, done.resent) == (2, 3)
            await wait_for(lambda: _count(seen, 8))
    finally:
        await receiver.stop()
    by_position = [n for _, n in sorted(seen)]
    assert by_position == sorted(by_position), seen  # positions follow the events' order
    newest: dict[str, tuple[int, int]] = {}
    for position, n in seen:  # a receiver applying only growing positions
        if position > newest.get("order-1", (0, -1))[0]:
            newest["order-1"] = (position, n)
    assert newest["order-1"][1] == 4


async def _count(seen: list[Any], n: int) -> bool:
    return len(seen) >= n
