"""Operators' holds (poller/operate/cancel.py): cancel ends open messages for good, ordered keys
move past them, a claim racing a cancel ends one way; pause holds an endpoint's messages
across restarts without touching its health."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from poller import Message, enqueue_many
from poller.cli import cli
from poller.endpoints.registry import create_endpoint, get_endpoint
from poller.errors import InvalidInput
from poller.local.receiver import Faults
from poller.operate.admin import retry_messages
from poller.operate.cancel import CancelFilter, cancel_messages, pause_endpoint, plan_cancel
from poller.operate.stats import queue_stats
from tests.integration.helpers import attempts_of, row, seed, wait_for
from tests.integration.service_helpers import (
    counts,
    fast_settings,
    running_poller,
    running_receiver,
)


def _ordered(engine: Engine, key: str, n: int) -> list[int]:
    with Session(engine) as session, session.begin():
        return enqueue_many(
            session,
            [Message("billing", "t", {"n": i}, f"{key}:{i}", ordering_key=key) for i in range(n)],
        )


def test_cancel_ends_open_messages_and_moves_ordered_keys_on(engine: Engine) -> None:
    with engine.begin() as conn:
        create_endpoint(conn, "billing", "http://127.0.0.1:9/h")
    plain = seed(engine, 2)
    head, middle, last = _ordered(engine, "order:1", 3)
    with engine.begin() as conn:  # one in flight: a poller holds it
        conn.execute(
            text(
                "UPDATE poller_outbox SET status = 'in_flight', claim_token = 1, "
                "claim_expires_at = now() + interval '1 minute' WHERE id = :id"
            ),
            {"id": plain[1]},
        )
    done = cancel_messages(engine, [plain[0], plain[1], middle, head, 999_999], who="ops:ann")
    assert done.cancelled == sorted([plain[0], middle, head])
    assert done.refused[plain[1]].startswith("in flight")
    assert done.refused[999_999] == "not found"
    # The head went, the middle one with it: the key goes straight to the last message.
    assert [row(engine, i).status for i in (head, middle, last)] == [
        "cancelled", "cancelled", "pending",
    ]  # fmt: skip
    (manual,) = attempts_of(engine, head)
    assert (manual.kind, manual.outcome, manual.poller_id) == ("manual", "cancelled", "ops:ann")
    assert row(engine, head).last_error == "cancelled by ops:ann"
    with engine.connect() as conn:
        assert queue_stats(conn)["totals"]["cancelled"] == 3
        assert cancel_messages(engine, [head]).refused == {head: "already cancelled"}
    assert retry_messages(engine, [plain[0]]) == 1  # an operator can undo it
    assert row(engine, plain[0]).status == "pending" and row(engine, plain[0]).cancelled_at is None


def test_cancel_by_endpoint_filters_and_refuses_nonsense(engine: Engine) -> None:
    with engine.begin() as conn:
        create_endpoint(conn, "billing", "http://127.0.0.1:9/h")
        create_endpoint(conn, "other", "http://127.0.0.1:9/h")
    ids = seed(engine, 3)
    seed(engine, 2, "other")
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE poller_outbox SET event_type = 'kept' WHERE id = :i"), {"i": ids[0]}
        )
    with engine.connect() as conn:
        plan = plan_cancel(conn, where=CancelFilter("billing", event_type="test.event"))
        assert plan.cancelled == ids[1:]
        assert plan_cancel(conn, where=CancelFilter("billing", event_type="x\x00")).cancelled == []
        assert (
            plan_cancel(
                conn, where=CancelFilter("billing", since=datetime.now(UTC) + timedelta(hours=1))
            ).cancelled
            == []
        )
        with pytest.raises(InvalidInput):
            plan_cancel(conn)
        with pytest.raises(InvalidInput, match="not in the future"):
            pause_endpoint(conn, "billing", until=datetime.now(UTC) - timedelta(seconds=1))


async def test_a_cancel_racing_two_pollers_ends_each_message_one_way(
    engine: Engine, db_url: str
) -> None:
    """Two pollers deliver 300 messages (some ordered) while an operator cancels them all,
    a batch at a time: each ends delivered or cancelled, and the receiver got exactly the
    delivered ones — none cancelled, none twice."""
    async with running_receiver(Faults(latency=0.005)) as (receiver, url):
        with engine.begin() as conn:
            create_endpoint(conn, "billing", f"{url}/hook")
        ids = seed(engine, 200)
        for k in range(10):
            ids += _ordered(engine, f"key:{k}", 10)
        settings = fast_settings()
        async with running_poller(db_url, settings, "p1"), running_poller(db_url, settings, "p2"):
            left = sorted(ids, reverse=True)  # the newest first: ahead of the pollers
            while left:
                chunk, left = left[:15], left[15:]
                done = await asyncio.to_thread(cancel_messages, engine, chunk, who="ops")
                left += [i for i, why in done.refused.items() if why.startswith("busy")]

            async def settled() -> bool:
                found = counts(engine)
                return set(found) <= {"delivered", "cancelled"}

            await wait_for(settled, timeout=30)
    with engine.connect() as conn:
        status = dict(conn.execute(text("SELECT idempotency_key, status FROM poller_outbox")).all())
    delivered = {k for k, s in status.items() if s == "delivered"}
    cancelled = {k for k, s in status.items() if s == "cancelled"}
    assert delivered | cancelled == set(status) and delivered and cancelled
    assert set(receiver.applied) == delivered  # nothing cancelled was sent
    assert all(n == 1 for n in receiver.applied.values())
    assert receiver.stats.order_violations == 0


async def test_a_pause_holds_across_a_restart_and_leaves_health_alone(
    engine: Engine, db_url: str
) -> None:
    async with running_receiver() as (receiver, url):
        with engine.begin() as conn:
            create_endpoint(conn, "billing", f"{url}/billing")
            create_endpoint(conn, "other", f"{url}/other")  # the barrier: pollers ran
            pause_endpoint(conn, "billing", who="ops:ann")
        seed(engine, 5)
        for run in range(2):  # the second poller is a restart: the pause holds
            with Session(engine) as session, session.begin():
                enqueue_many(session, [Message("other", "t", {}, f"o:{run}:{i}") for i in range(3)])

            async def others_delivered(expected: int = 3 * (run + 1)) -> bool:
                return receiver.stats.per_path["/other"] == expected

            async with running_poller(db_url, fast_settings(), f"p{run}"):
                await wait_for(others_delivered, timeout=10)
            assert receiver.stats.per_path["/billing"] == 0
        with engine.connect() as conn:
            held = get_endpoint(conn, "billing")
            health = conn.execute(
                text("SELECT state, consecutive_failures FROM poller_endpoint_health h "
                     "JOIN poller_endpoints e ON e.id = h.endpoint_id WHERE e.name = 'billing'")
            ).one()  # fmt: skip
        assert held.paused and held.held_by == "ops:ann" and held.enabled
        assert tuple(health) == ("closed", 0)
        runner = CliRunner()
        env = {"POLLER_DATABASE_URL": db_url}
        resumed = runner.invoke(cli, ["endpoints", "resume", "billing"], env=env)
        assert resumed.exit_code == 0, resumed.output

        async def billing_delivered() -> bool:
            return receiver.stats.per_path["/billing"] == 5

        async with running_poller(db_url, fast_settings(), "p9"):
            await wait_for(billing_delivered, timeout=10)


def test_the_cli_cancels_pauses_and_refuses_in_one_line(engine: Engine, db_url: str) -> None:
    env = {"POLLER_DATABASE_URL": db_url, "POLLER_ALLOW_PRIVATE_TARGETS": "true"}
    runner = CliRunner()

    def run(*args: str) -> tuple[int, str]:
        result = runner.invoke(cli, list(args), env=env)
        assert "Traceback" not in result.output
        return result.exit_code, result.output

    assert run("endpoints", "add", "billing", "http://127.0.0.1:9/h")[0] == 0
    ids = seed(engine, 3)
    code, out = run("admin", "cancel", "--endpoint", "billing", "--dry-run", "--json")
    assert code == 0 and json.loads(out)["ids"] == ids and counts(engine) == {"pending": 3}
    code, out = run("admin", "cancel", str(ids[0]), "--yes", "--json")
    assert code == 0 and json.loads(out)["ids"] == [ids[0]]
    code, out = run("admin", "cancel", "--endpoint", "billing", "--yes")
    assert code == 0 and "cancelled 2" in out
    code, out = run("admin", "cancel", str(ids[0]), "--yes")  # again: one line, no contradiction
    assert code == 1 and out == f"error: nothing cancelled: {ids[0]}: already cancelled\n"
    code, out = run("admin", "stats", "--json")
    assert json.loads(out)["totals"]["cancelled"] == 3
    for args, said in (
        (("admin", "cancel"), "give message ids, or --endpoint"),
        (("admin", "cancel", "1", "--endpoint", "billing"), "not both"),
        (("admin", "cancel", "--since", "1h"), "go with --endpoint"),
        (("admin", "cancel", "--endpoint", "nope", "--yes"), "nope"),
        (("endpoints", "pause", "billing", "--until", "2000-01-01T00:00:00"), "not in the future"),
        (("endpoints", "pause", "billing", "--until", "soon"), "neither a duration"),
        (("endpoints", "pause", "billing", "--until", "9999-12-31T23:59:59-14:00"), "9999 in UTC"),
        (("endpoints", "pause", "nope"), "nope"),
        (("endpoints", "resume", "nope\x00"), "nope"),
    ):
        code, out = run(*args)
        assert code in (1, 2) and said in out, (args, out)
    code, out = run("endpoints", "pause", "billing", "--until", "2h", "--json")
    assert code == 0 and json.loads(out)["held_until"]
    code, out = run("endpoints", "show", "billing")
    assert "paused until" in out


def test_the_internal_admin_functions_check_their_own_input(engine: Engine, endpoint) -> None:  # type: ignore[no-untyped-def]
    """The faces check ids, limits and times before calling these; called directly, an id
    past bigint named no row where PostgreSQL raised DataError, and a naive time raised
    TypeError."""
    from poller.errors import EventNotFound, MessageNotFound
    from poller.operate import admin, replay

    (kept,) = seed(engine, 1)
    huge, tiny = 2**63, -(2**63) - 1
    with engine.connect() as conn:
        for bad in (huge, 0, tiny):
            with pytest.raises(MessageNotFound):
                admin.message_detail(conn, bad)
            with pytest.raises(EventNotFound):
                replay.event_detail(conn, bad)
        missing = {huge: "not found", tiny: "not found"}
        assert admin.plan_retry(conn, [huge, tiny]).skipped == missing
        assert [m["id"] for m in admin.list_messages(conn, before=huge)] == [kept]
        assert admin.list_messages(conn, before=tiny) == []
        for call in (admin.list_messages, admin.list_failed):
            with pytest.raises(InvalidInput, match="limit -1"):
                call(conn, limit=-1)
        with pytest.raises(InvalidInput, match="timezone-aware"):
            pause_endpoint(conn, "billing", until=datetime(2999, 1, 1))
    done = cancel_messages(engine, [huge, kept, tiny])
    assert done.cancelled == [kept] and done.refused == missing
    since = datetime.now(UTC) - timedelta(days=1)
    assert replay.replay(engine, "billing", since=since, event_id=huge).events == 0


def test_a_retry_never_overflows_an_attempt_budget_stored_before_the_bound(
    engine: Engine, endpoint: object
) -> None:
    """An endpoint's max_attempts of 2**31 - 1 (a tenant could set it before every door
    bounded it): retrying its failed message gives the column's most, not a 500."""
    (msg_id,) = seed(engine, 1)
    with engine.begin() as conn:
        conn.execute(text("UPDATE poller_endpoints SET max_attempts = 2147483647"))
        conn.execute(text("UPDATE poller_outbox SET status = 'failed', attempts = 5"))
    assert retry_messages(engine, [msg_id]) == 1
    assert row(engine, msg_id).max_attempts == 2**31 - 1
