"""The operator CLI against a real database: endpoints, enqueue, admin."""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import Engine, text

from poller.cli import cli
from poller.rows.claims import Claims
from poller.rules.outcomes import delivered, failed
from poller.store.db import async_engine
from tests.integration.helpers import attempts_of, row, seed


@pytest.fixture
def run(db_url: str):  # type: ignore[no-untyped-def]
    def invoke(*args: str, **env: str) -> tuple[int, str, str]:
        result = CliRunner().invoke(
            cli, list(args), env={"POLLER_DATABASE_URL": db_url, **env}, catch_exceptions=False
        )
        return result.exit_code, result.stdout, result.stderr

    return invoke


def _json(out: str) -> Any:
    return json.loads(out)


def test_endpoint_lifecycle_and_secrets_shown_only_once(run, engine: Engine) -> None:  # type: ignore[no-untyped-def]
    code, out, _ = run(
        "endpoints",
        "add",
        "billing",
        "http://127.0.0.1:9/hook",
        "--lookup-url",
        "http://127.0.0.1:9/hook/{idempotency_key}",
        "--max-attempts",
        "5",
    )
    assert code == 0
    secret = out.split("receiver): ")[1].strip()
    assert secret.startswith("whsec_")
    seen = [
        run("endpoints", "list")[1],
        run("endpoints", "show", "billing")[1],
        run("endpoints", "list", "--json")[1],
        run("endpoints", "show", "billing", "--json")[1],
    ]
    assert not any(secret in output for output in seen)
    shown = _json(seen[3])
    assert shown["max_attempts"] == 5 and "secret" not in shown
    assert run("endpoints", "update", "billing", "--max-in-flight", "4")[0] == 0
    code, out, _ = run("endpoints", "rotate-secret", "billing", "--keep-old-for", "1h", "--yes")
    new_secret = out.split("(shown once): ")[1].split()[0]
    assert code == 0 and new_secret != secret
    with engine.connect() as conn:
        stored = conn.execute(text("SELECT secret, previous_secret FROM poller_endpoints")).one()
    assert tuple(stored) == (new_secret, secret)  # both sign during the overlap


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (("endpoints", "add", "x", "file:///etc/passwd"), 2, "http, https, nats"),
        (("endpoints", "add", "bad name!", "http://h.example/"), 2, "endpoint name"),
        (("endpoints", "add", "x", "http://h.example/", "--max-attempts", "0"), 2, "max-attempts"),
        (("endpoints", "show", "ghost"), 1, "unknown endpoint"),
        (("enqueue", "ghost", "e", "--data", "{}", "--key", "k"), 1, "unknown endpoint"),
        (("admin", "show", "999999"), 1, "no message 999999"),
        (("admin", "failed", "--since", "yesterday"), 2, "neither a duration"),
        (("admin", "failed", "--limit", "-1"), 2, "--limit"),
        (("admin", "purge", "--delivered-older-than", "7 fortnights"), 2, "not a duration"),
        # a time in the year 10198 no reader could load, and one out of PostgreSQL's range
        (("endpoints", "rotate-secret", "x", "--keep-old-for", "3000000d"), 2, "100 years"),
        (("admin", "purge", "--delivered-older-than", "3000000d"), 2, "100 years"),
        (("admin", "failed", "--endpoint", "x' OR 1=1 --"), 1, "unknown endpoint"),
        (("admin", "retry"), 2, "message ids, or --all-failed"),
        # Found by tests/acceptance/test_cli_fuzz.py: these were tracebacks.
        (("db", "upgrade", "--revision", ""), 2, "not a revision of this package"),
        (("db", "upgrade", "--revision", "head+5"), 2, "not a revision of this package"),
        (("admin", "replay", "--endpoint", "x", "--since", "1h", "--event-type", "a\x00"),
         2, "no event can have it"),
        (("endpoints", "health", "a\x00"), 1, "unknown endpoint"),
        (("admin", "blocked", "--endpoint", "a\x00"), 0, ""),  # an empty list
        # int() of more than 4,300 digits raises: "unexpected error (a bug)"
        (("admin", "show", "7" * 5000), 2, "not a message id"),
        (("admin", "retry", "7" * 5000, "--yes"), 2, "not a message id"),
    ],
)  # fmt: skip
def test_bad_input_exits_with_one_line(run, args, code, message) -> None:  # type: ignore[no-untyped-def]
    got, out, err = run(*args)
    assert got == code, out + err
    assert message in err and "Traceback" not in out + err


def test_private_targets_refused_unless_allowed(run) -> None:  # type: ignore[no-untyped-def]
    code, _, err = run(
        "endpoints", "add", "x", "http://10.1.2.3/hook", POLLER_ALLOW_PRIVATE_TARGETS="false"
    )
    assert code == 2 and "POLLER_ALLOW_PRIVATE_TARGETS" in err


def test_destructive_commands_refuse_without_yes_and_no_terminal(run) -> None:  # type: ignore[no-untyped-def]
    run("endpoints", "add", "billing", "http://127.0.0.1:9/")
    code, _, err = run("endpoints", "disable", "billing")
    assert code == 2 and "--yes" in err
    assert _json(run("endpoints", "show", "billing", "--json")[1])["enabled"] is True
    assert run("endpoints", "disable", "billing", "--reason", "maintenance", "--yes")[0] == 0
    assert (
        _json(run("endpoints", "show", "billing", "--json")[1])["disabled_reason"] == "maintenance"
    )
    assert run("endpoints", "enable", "billing")[0] == 0


def test_remove_refused_while_messages_exist(run, engine: Engine) -> None:  # type: ignore[no-untyped-def]
    run("endpoints", "add", "billing", "http://127.0.0.1:9/")
    seed(engine, 3)
    code, _, err = run("endpoints", "remove", "billing", "--yes")
    assert code == 2 and "3 messages" in err
    assert run("endpoints", "remove", "billing", "--yes", "--force")[0] == 0
    assert run("endpoints", "show", "billing")[0] == 1


def test_enqueue_from_the_command_line(run, engine: Engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    run("endpoints", "add", "billing", "http://127.0.0.1:9/")
    code, out, _ = run(
        "enqueue", "billing", "invoice.paid", "--data", '{"invoice": 42}', "--key", "invoice:42"
    )
    assert code == 0 and out.startswith("message ")
    (tmp_path / "p.json").write_text('{"from": "file"}')
    assert run("enqueue", "billing", "e", "--data", f"@{tmp_path / 'p.json'}", "--key", "f")[0] == 0
    code, _, err = run("enqueue", "billing", "e", "--data", "{not json", "--key", "k2")
    assert code == 2 and "not JSON" in err
    (tmp_path / "bin.json").write_bytes(b'{"a": "\xff"}')
    for source, says in (
        ("@/dev/zero", "over POLLER_MAX_PAYLOAD_BYTES (1024 bytes)"),  # read no further
        (f"@{tmp_path / 'bin.json'}", "not UTF-8 text (at byte 7)"),
        (f"@{tmp_path}", "cannot read"),
        (f"@{tmp_path / 'missing.json'}", "cannot read"),
    ):
        code, out, err = run(
            "enqueue", "billing", "e", "--data", source, "--key", "k3",
            POLLER_MAX_PAYLOAD_BYTES="1024",
        )  # fmt: skip
        assert code == 2 and says in err and "Traceback" not in out + err, (source, err)


async def _fail_some(db_url: str, engine: Engine, n: int) -> list[int]:
    """Seed ``n`` messages and fail them (one attempt each) through the claim core."""
    ids = seed(engine, n)
    aengine = async_engine(db_url)
    claims = Claims(aengine, poller_id="p", claim_lease=30)
    batch = await claims.claim_batch(n)
    await claims.complete([failed(m, status_code=500, error_message="HTTP 500") for m in batch])
    await aengine.dispose()
    return ids


async def test_failed_show_retry_and_stats(run, db_url: str, engine: Engine) -> None:  # type: ignore[no-untyped-def]
    run("endpoints", "add", "billing", "http://127.0.0.1:9/")
    assert run("admin", "failed")[0] == 1  # nothing failed yet
    ids = await _fail_some(db_url, engine, 3)
    code, out, _ = run("admin", "failed", "--json", "--since", "1h")
    assert code == 0 and sorted(r["id"] for r in _json(out)) == ids
    assert _json(out)[0]["last_error"] == "HTTP 500"
    code, out, _ = run("admin", "show", str(ids[0]), "--json")
    detail = _json(out)
    assert detail["payload"] == {"n": 0} and detail["attempts_log"][0]["outcome"] == "failed"
    assert "payload" not in _json(run("admin", "show", str(ids[0]), "--json", "--no-payload")[1])
    assert (
        _json(run("admin", "show", "--key", "billing:1", "--endpoint", "billing", "--json")[1])[
            "id"
        ]
        == ids[1]
    )

    code, out, _ = run("admin", "retry", "--all-failed", "--dry-run", "--json")
    assert code == 0 and _json(out)["ids"] == ids and row(engine, ids[0]).status == "failed"
    assert run("admin", "retry", str(ids[0]))[0] == 2  # no terminal, no --yes
    code, out, _ = run("admin", "retry", str(ids[0]), "999999", "--yes")
    assert code == 0 and "skipped 999999: not found" in out
    retried = row(engine, ids[0])
    assert (retried.status, retried.attempts, retried.max_attempts) == ("pending", 1, 11)
    assert attempts_of(engine, ids[0])[-1].kind == "manual"
    assert attempts_of(engine, ids[0])[-1].poller_id.startswith("admin:")

    stats = _json(run("admin", "stats", "--json")[1])
    assert stats["totals"] == {
        "waiting": 0,
        "pending": 1,
        "in_flight": 0,
        "delivered": 0,
        "failed": 2,
        "cancelled": 0,
    }
    assert stats["endpoints"]["billing"]["failed"] == 2 and stats["failed_last_hour"] == 2


async def test_delivered_messages_are_resent_only_with_force(
    run,
    db_url: str,
    engine: Engine,  # type: ignore[no-untyped-def]
) -> None:
    run("endpoints", "add", "billing", "http://127.0.0.1:9/")
    (msg_id,) = seed(engine, 1)
    aengine = async_engine(db_url)
    claims = Claims(aengine, poller_id="p", claim_lease=30)
    await claims.complete([delivered(m) for m in await claims.claim_batch(1)])
    await aengine.dispose()
    code, _, err = run("admin", "retry", str(msg_id), "--yes")
    assert code == 1 and "nothing matched" in err
    assert run("admin", "retry", str(msg_id), "--yes", "--force")[0] == 0
    assert row(engine, msg_id).status == "pending"


async def test_purge_removes_only_what_it_says(run, db_url: str, engine: Engine) -> None:  # type: ignore[no-untyped-def]
    run("endpoints", "add", "billing", "http://127.0.0.1:9/")
    ids = await _fail_some(db_url, engine, 2)
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE poller_outbox SET failed_at = now() - interval '40 days' WHERE id = :i"),
            {"i": ids[0]},
        )
    code, out, _ = run("admin", "purge", "--failed-older-than", "30d", "--dry-run", "--json")
    assert _json(out)["would_delete"] == {"failed": 1, "cancelled": 0} and row(engine, ids[0])
    assert run("admin", "purge", "--failed-older-than", "30d")[0] == 2  # asks first
    code, out, _ = run("admin", "purge", "--failed-older-than", "30d", "--yes")
    assert code == 0 and "deleted 1 failed" in out
    with engine.connect() as conn:
        left = [r for (r,) in conn.execute(text("SELECT id FROM poller_outbox ORDER BY id"))]
    assert left == [ids[1]]
    code, out, _ = run("admin", "purge", "--failed-older-than", "30d", "--yes")
    assert code == 0 and "deleted 0 failed" in out  # counts what it deleted, nothing more


def test_leases_lists_shards(run, engine: Engine) -> None:  # type: ignore[no-untyped-def]
    code, out, _ = run("admin", "leases", "--json")
    assert code == 0 and [r["key"] for r in _json(out)] == ["maintenance"]  # no poller yet


async def test_a_receiver_down_for_an_hour_then_retried_from_the_cli(
    run,
    db_url: str,
    engine: Engine,  # type: ignore[no-untyped-def]
) -> None:
    """The worked example in docs/how-to/operate.md: failures found, fixed, retried, delivered."""
    import asyncio

    from poller.local.receiver import Faults
    from tests.integration.helpers import wait_for
    from tests.integration.service_helpers import (
        counts,
        fast_settings,
        running_poller,
        running_receiver,
    )

    async with (
        running_receiver(Faults(fail_rate=1.0, status=503)) as (down, down_url),
        running_receiver() as (up, up_url),
    ):
        await asyncio.to_thread(run, "endpoints", "add", "billing", down_url, "--max-attempts", "2")
        seed(engine, 5)
        async with running_poller(db_url, fast_settings()):

            async def all_failed() -> bool:
                return counts(engine) == {"failed": 5}

            await wait_for(all_failed, timeout=20)
            code, out, _ = await asyncio.to_thread(run, "admin", "failed", "--json")
            assert code == 0 and len(_json(out)) == 5
            await asyncio.to_thread(run, "endpoints", "update", "billing", "--url", up_url)
            code, out, _ = await asyncio.to_thread(
                run, "admin", "retry", "--all-failed", "--endpoint", "billing", "--yes"
            )
            assert code == 0 and out.startswith("retried 5")

            async def delivered() -> bool:
                return counts(engine) == {"delivered": 5}

            await wait_for(delivered, timeout=10)
    assert down.stats.received == 10 and up.stats.applied == 5


def test_admin_as_a_real_process(db_url: str) -> None:
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("POLLER_")}
    env["POLLER_DATABASE_URL"] = db_url
    done = subprocess.run(
        [sys.executable, "-m", "poller", "admin", "stats", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["totals"]["pending"] == 0
    done = subprocess.run(
        [sys.executable, "-m", "poller", "admin", "purge", "--failed-older-than", "1d"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert done.returncode == 0 and "deleted 0 failed" in done.stdout  # nothing to ask about


def test_filters_no_row_can_match_list_nothing(run, engine: Engine) -> None:  # type: ignore[no-untyped-def]
    """A NUL cannot reach PostgreSQL (it refuses one in text): such a filter matches
    nothing, as a type no message can have does."""
    from poller.operate.admin import FailedFilter, list_failed

    with engine.connect() as conn:  # before, each of these raised psycopg's DataError
        for where in (
            FailedFilter(event_type="a\x00"),
            FailedFilter(event_type="x" * 300),
            FailedFilter(error="HTTP\x00"),
        ):
            assert list_failed(conn, where=where) == []
    code, out, err = run("admin", "failed", "--event-type", "a\x00")
    assert code == 1 and "Traceback" not in out + err  # 1: none


HOSTILE_ANSWER = (
    "[/x] [link=http://evil.example]click[/link] \x1b]52;c;aGk=\x07 \x1b[2J \x9b \u202e"
)


async def test_a_receivers_words_never_drive_the_terminal(run, db_url: str, engine: Engine) -> None:  # type: ignore[no-untyped-def]
    """A receiver's error and answer reach the operator's terminal: escape sequences
    (clipboard writes, screen clears, C1 CSI, bidi overrides) are shown escaped, and rich
    never reads them as markup (`[/x]` crashed `admin failed`; `[link=…]` made a link)."""
    run("endpoints", "add", "billing", "http://127.0.0.1:9/")
    from poller.outbox.enqueue import Message, enqueue_many

    with engine.begin() as conn:
        (msg_id,) = enqueue_many(
            conn, [Message("billing", "test.event", {"note": "\x1b[31m red \u202e"}, "k")]
        )
    aengine = async_engine(db_url)
    claims = Claims(aengine, poller_id="p", claim_lease=30)
    (msg,) = await claims.claim_batch(1)
    hostile = failed(
        msg, status_code=500, error_message=f"HTTP 500: {HOSTILE_ANSWER}",
        response_excerpt=HOSTILE_ANSWER,
    )  # fmt: skip
    await claims.complete([hostile])
    await aengine.dispose()
    for args in (
        ("admin", "failed"),
        ("admin", "show", str(msg_id)),
        ("admin", "show", str(msg_id), "--json"),
        ("admin", "failed", "--json"),
        ("endpoints", "health"),
    ):
        code, out, err = run(*args)
        assert code == 0, (args, out + err)
        for control in ("\x1b", "\x07", "\x9b", "\u202e"):
            assert control not in out + err, (args, control)
        if args[0] == "admin" and "--json" not in args:
            assert "[/x]" in out  # shown as it came, not read as markup
    detail = _json(run("admin", "show", str(msg_id), "--json")[1])
    assert detail["payload"] == {"note": "\x1b[31m red \u202e"}  # the same JSON to a parser


def test_a_disable_reason_is_stored_whatever_it_holds(run, engine: Engine) -> None:  # type: ignore[no-untyped-def]
    """Found by the CLI fuzz test: a NUL in --reason reached PostgreSQL (DataError)."""
    run("endpoints", "add", "billing", "http://127.0.0.1:9/")
    code, out, err = run("endpoints", "disable", "billing", "--reason", "a\x00b\ud800", "--yes")
    assert code == 0, out + err
    with engine.connect() as conn:
        said = conn.execute(text("SELECT disabled_reason FROM poller_endpoints")).scalar_one()
    assert said == "a\ufffdb\ufffd\ufffd\ufffd"  # the lone surrogate: its 3 bytes, replaced


def test_an_unexpected_exception_is_a_bug_not_a_not_found(
    run, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """A KeyError from a bug is a LookupError; it used to pass as "not found", exit 1."""

    def broken(*args: object, **kwargs: object) -> None:
        raise KeyError("state")

    monkeypatch.setattr("poller.operate.admin.message_detail", broken)
    got, out, err = run("admin", "show", "1")
    assert got == 70, out + err
    assert err.startswith("error: unexpected error (a bug") and "KeyError" in err
    assert len(err.splitlines()) == 1 and "Traceback" not in out + err
    got, _, err = run("-v", "admin", "show", "1")
    assert got == 70 and "Traceback" in err and "KeyError: 'state'" in err
