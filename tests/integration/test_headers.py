"""Per-endpoint receiver options: headers (poller/endpoints/headers.py) checked, sealed at
rest, sent on deliveries and lookups through both HTTP clients, and never shown; and an endpoint's
own retry schedule."""

from __future__ import annotations

import dataclasses
import json

import pytest
from click.testing import CliRunner
from sqlalchemy import Engine, text

from poller.cli import cli
from poller.deliver.delivery import lookup, send
from poller.deliver.wire import Sender
from poller.endpoints.headers import MAX_BYTES, MAX_HEADERS, check_headers
from poller.endpoints.keys import reseal_secrets
from poller.endpoints.registry import create_endpoint, get_endpoint, update_endpoint
from poller.errors import InvalidEndpoint
from poller.local.receiver import Faults
from poller.rules.keyring import Keyring, new_key
from tests.conftest import make_endpoint
from tests.integration import servers
from tests.integration.helpers import seed, wait_for
from tests.integration.service_helpers import fast_settings, running_poller, running_receiver
from tests.integration.test_delivery import _endpoint, _message
from tests.integration.test_delivery import client as client  # the fixture: both senders

TOKEN = "Bearer planted-credential-7f3a"  # must never appear in any output


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        ({"Bad Name": "x"}, "not an HTTP token"),
        ({"X-A\r\nX-B": "x"}, "not an HTTP token"),
        ({"": "x"}, "not an HTTP token"),
        ({"X-Key": "a\r\nX-Injected: 1"}, "visible ASCII"),
        ({"X-Key": "a\nb"}, "visible ASCII"),
        ({"X-Key": "a\x00b"}, "visible ASCII"),
        ({"X-Key": "clé"}, "visible ASCII"),
        ({"X-Key": " padded"}, "visible ASCII"),
        ({"X-Key": ""}, "visible ASCII"),
        ({"Host": "evil.example"}, "set by the poller"),
        ({"content-length": "0"}, "set by the poller"),
        ({"Transfer-Encoding": "chunked"}, "set by the poller"),
        ({"Connection": "close"}, "set by the poller"),
        ({"Webhook-Signature": "v1,forged"}, "set by the poller"),
        ({"webhook-ordering-seq": "1"}, "set by the poller"),
        ({"Proxy-Authorization": "Basic x"}, "set by the poller"),
        ({"User-Agent": "me"}, "set by the poller"),
        ({"Idempotency-Key": "k"}, "set by the poller"),
        ({"X-Key": "a", "x-key": "b"}, "given twice"),
        ({f"X-{i}": "v" for i in range(MAX_HEADERS + 1)}, f"at most {MAX_HEADERS}"),
        ({"X-Big": "v" * MAX_BYTES}, f"at most {MAX_BYTES} bytes"),
    ],
)  # fmt: skip
def test_bad_headers_are_refused_without_showing_the_value(
    headers: dict[str, str], message: str
) -> None:
    with pytest.raises(InvalidEndpoint, match=message) as refused:
        check_headers(headers)
    for value in headers.values():
        if len(value) > 3:
            assert value not in str(refused.value)


def test_headers_are_sealed_at_rest_and_resealed(engine: Engine) -> None:
    keyring = Keyring([new_key()])
    with engine.begin() as conn:
        create_endpoint(
            conn, "billing", "http://127.0.0.1:9/h", keyring=keyring,
            headers={"Authorization": TOKEN, "X-Api-Key": "k-1234"},
        )  # fmt: skip
    with engine.connect() as conn:
        stored = conn.execute(text("SELECT headers FROM poller_endpoints")).scalar_one()
        found = get_endpoint(conn, "billing", keyring=keyring)
    assert stored.startswith("fernet:") and "planted" not in stored
    assert found.headers == (("Authorization", TOKEN), ("X-Api-Key", "k-1234"))
    assert "planted" not in repr(found) and found.header_names == ("Authorization", "X-Api-Key")
    with engine.begin() as conn:
        reseal_secrets(conn, plain=True, keyring=keyring)
    with engine.connect() as conn:
        stored = conn.execute(text("SELECT headers FROM poller_endpoints")).scalar_one()
        assert get_endpoint(conn, "billing", keyring=Keyring()).headers == found.headers
    assert stored.startswith("headers:")  # plain again, as the secrets are


def test_update_merges_removes_and_clears(engine: Engine) -> None:
    with engine.begin() as conn:
        create_endpoint(conn, "billing", "http://127.0.0.1:9/h", headers={"X-A": "1", "X-B": "2"})
        changed = update_endpoint(conn, "billing", headers={"x-a": "one", "X-C": "3", "X-B": None})
        assert changed.headers == (("x-a", "one"), ("X-C", "3"))
        changed = update_endpoint(conn, "billing", clear_headers=True, headers={"X-D": "4"})
        assert changed.headers == (("X-D", "4"),)
        assert update_endpoint(conn, "billing", clear_headers=True).headers == ()
        with pytest.raises(InvalidEndpoint, match="set by the poller"):
            update_endpoint(conn, "billing", headers={"Host": "x"})


async def test_headers_go_with_every_delivery_and_lookup(client: Sender) -> None:
    seen: list[dict[str, str]] = []

    async def capture(reader, writer):  # type: ignore[no-untyped-def]
        raw = await servers.read_request(reader)
        lines = raw.partition(b"\r\n\r\n")[0].decode().split("\r\n")
        seen.append({k.lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:])})
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()

    async with servers.raw_server(capture) as url:
        endpoint = dataclasses.replace(
            _endpoint(url, lookup_url=url + "/{idempotency_key}"),
            headers=(("Authorization", TOKEN), ("X-Api-Key", "k-1")),
        )
        await send(client, endpoint, _message(), timeout=2, user_agent="t")
        await lookup(client, endpoint, _message(), timeout=2, user_agent="t")
    assert len(seen) == 2
    for headers in seen:
        assert headers["authorization"] == TOKEN and headers["x-api-key"] == "k-1"
        assert headers["webhook-id"] == "invoice:42"  # ours beside them


def test_the_cli_sets_headers_and_shows_only_their_names(engine: Engine, db_url: str) -> None:
    def run(*args: str) -> tuple[int, str]:
        result = CliRunner().invoke(
            cli,
            list(args),
            env={"POLLER_DATABASE_URL": db_url, "POLLER_ALLOW_PRIVATE_TARGETS": "true"},
        )
        return result.exit_code, result.output

    code, out = run(
        "endpoints", "add", "billing", "http://127.0.0.1:9/h",
        "--header", f"Authorization: {TOKEN}", "--header", "X-Api-Key: k-1", "--json",
    )  # fmt: skip
    assert code == 0, out
    assert json.loads(out)["headers"] == ["Authorization", "X-Api-Key"]
    outputs = [out]
    for args in (
        ("endpoints", "show", "billing"),
        ("endpoints", "show", "billing", "--json"),
        ("endpoints", "list"),
        ("endpoints", "list", "--json"),
        ("endpoints", "update", "billing", "--header", "X-Api-Key:", "--json"),
    ):
        code, out = run(*args)
        assert code == 0, (args, out)
        outputs.append(out)
    assert json.loads(outputs[-1])["headers"] == ["Authorization"]
    assert all("planted" not in o and "k-1" not in o for o in outputs)
    code, out = run("endpoints", "update", "billing", "--header", f"Host {TOKEN}")
    assert code == 2 and "NAME: VALUE" in out and "planted" not in out
    code, out = run("endpoints", "update", "billing", "--header", f"Host: {TOKEN}")
    assert code == 2 and "'Host'" in out and "planted" not in out
    with engine.connect() as conn:
        assert get_endpoint(conn, "billing").headers == (("Authorization", TOKEN),)


def test_header_values_can_stay_out_of_the_process_list(engine: Engine, db_url: str) -> None:
    """--headers-from reads them from standard input (or a file): nothing secret is in
    the command line, which every user of the host can read."""
    make_endpoint(engine, "billing")
    result = CliRunner().invoke(
        cli,
        ["endpoints", "update", "billing", "--headers-from", "-", "--json"],
        input=f"# the receiver's gateway\nAuthorization: {TOKEN}\n\nX-Team: pay\n",
        env={"POLLER_DATABASE_URL": db_url, "POLLER_ALLOW_PRIVATE_TARGETS": "true"},
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["headers"] == ["Authorization", "X-Team"]
    with engine.connect() as conn:
        assert dict(get_endpoint(conn, "billing").headers)["Authorization"] == TOKEN


# --- its own retry schedule (issue 27) ----------------------------------------------


@pytest.mark.parametrize(
    ("schedule", "message"),
    [
        ([], "1 to 50 intervals"),
        ("5,10", "1 to 50 intervals"),
        ([0], "more than 0 s"),
        ([-5], "more than 0 s"),
        ([float("nan")], "more than 0 s"),
        ([float("inf")], "more than 0 s"),
        ([31 * 86400], "at most 30 days"),
        (["5"], "not a number"),
        ([True], "not a number"),
        ([1] * 51, "at most 50"),
    ],
)  # fmt: skip
def test_a_bad_retry_schedule_is_refused(engine: Engine, schedule: object, message: str) -> None:
    with engine.begin() as conn, pytest.raises(InvalidEndpoint, match=message):
        create_endpoint(conn, "billing", "http://127.0.0.1:9/h", retry_schedule=schedule)  # type: ignore[arg-type]


def test_the_cli_sets_and_resets_a_retry_schedule(engine: Engine, db_url: str) -> None:
    env = {"POLLER_DATABASE_URL": db_url, "POLLER_ALLOW_PRIVATE_TARGETS": "true"}
    runner = CliRunner()
    added = runner.invoke(
        cli,
        ["endpoints", "add", "billing", "http://127.0.0.1:9/h", "--retry-schedule", "5s,5m,2h",
         "--json"],
        env=env,
    )  # fmt: skip
    assert added.exit_code == 0, added.output
    assert json.loads(added.output)["retry_schedule"] == [5.0, 300.0, 7200.0]
    shown = runner.invoke(cli, ["endpoints", "show", "billing"], env=env)
    assert "5s, 300s, 7200s" in shown.output
    bad = runner.invoke(
        cli, ["endpoints", "update", "billing", "--retry-schedule", "5s,soon"], env=env
    )
    assert bad.exit_code == 2 and "e.g. 5s,5m,30m" in bad.output
    reset = runner.invoke(
        cli, ["endpoints", "update", "billing", "--retry-schedule", "default", "--json"], env=env
    )
    assert reset.exit_code == 0 and json.loads(reset.output)["retry_schedule"] is None
    with engine.connect() as conn:
        assert get_endpoint(conn, "billing").retry_schedule is None


async def test_a_failed_send_backs_off_on_the_endpoints_schedule(
    engine: Engine, db_url: str
) -> None:
    """Global schedule 0.2 s, the endpoint's 1 h: the retry is due in an hour (±20 %)."""
    async with running_receiver(Faults(fail_rate=1.0, status=500)) as (_receiver, url):
        with engine.begin() as conn:
            create_endpoint(conn, "billing", url, retry_schedule=[3600.0])
        seed(engine, 1, "billing")
        async with running_poller(db_url, fast_settings(retry_schedule=[0.2])):

            async def attempted() -> bool:  # the send failed and its retry is scheduled
                with engine.connect() as conn:
                    return bool(
                        conn.execute(
                            text(
                                "SELECT count(*) FROM poller_outbox "
                                "WHERE attempts = 1 AND status = 'pending'"
                            )
                        ).scalar()
                    )

            await wait_for(attempted, timeout=10)
    with engine.connect() as conn:
        due_in = conn.execute(
            text("SELECT extract(epoch FROM next_attempt_at - now()) FROM poller_outbox")
        ).scalar_one()
    assert 3600 * 0.75 < float(due_in) < 3600 * 1.25, due_in


# --- its age limit (issue 27) --------------------------------------------------------


async def test_a_message_past_the_age_limit_ends_expired_unsent_unless_it_arrived(
    engine: Engine, db_url: str
) -> None:
    """Three messages an hour old on an endpoint with max_age 10 min: the plain one ends
    failed (expired) with nothing sent; one whose earlier outcome is unknown is looked up
    first — the receiver has it, so it is delivered; a fresh one is sent."""
    async with running_receiver() as (receiver, url):
        with engine.begin() as conn:
            create_endpoint(
                conn, "billing", f"{url}/hook", max_age=600.0,
                lookup_url=f"{url}/webhooks/{{idempotency_key}}",
            )  # fmt: skip
        old, arrived, fresh = seed(engine, 3)
        receiver.applied["billing:1"] = 1  # an earlier attempt reached it, unanswered
        with engine.begin() as conn:
            conn.execute(
                text(
                    "UPDATE poller_outbox SET created_at = now() - interval '1 hour', "
                    "needs_lookup = (id = :arrived) WHERE id IN (:old, :arrived)"
                ),
                {"old": old, "arrived": arrived},
            )
        async with running_poller(db_url, fast_settings()):

            async def ended() -> bool:
                with engine.connect() as conn:
                    return not conn.execute(
                        text("SELECT count(*) FROM poller_outbox WHERE status = 'pending'")
                    ).scalar()

            await wait_for(ended, timeout=10)
    with engine.connect() as conn:
        rows = {
            r.id: r for r in conn.execute(text("SELECT id, status, last_error FROM poller_outbox"))
        }
        kinds = conn.execute(
            text("SELECT kind, outcome FROM poller_delivery_attempts WHERE message_id = :id"),
            {"id": old},
        ).all()
    assert rows[old].status == "failed" and rows[old].last_error.startswith("expired: ")
    assert kinds == [("expiry", "expired")]
    assert rows[arrived].status == "delivered" and rows[fresh].status == "delivered"
    assert receiver.stats.per_path["/hook"] == 1  # only the fresh one was sent


def test_the_cli_sets_and_removes_an_age_limit(engine: Engine, db_url: str) -> None:
    env = {"POLLER_DATABASE_URL": db_url, "POLLER_ALLOW_PRIVATE_TARGETS": "true"}
    runner = CliRunner()
    added = runner.invoke(
        cli, ["endpoints", "add", "billing", "http://127.0.0.1:9/h", "--max-age", "3d", "--json"],
        env=env,
    )  # fmt: skip
    assert added.exit_code == 0 and json.loads(added.output)["max_age"] == 3 * 86400
    for bad, said in (
        ("0s", "not a duration"), ("soon", "e.g. 3d"), ("400d", "at most 365 days"),
        ("0.5s", "at least 1 s"),
    ):  # fmt: skip
        refused = runner.invoke(cli, ["endpoints", "update", "billing", "--max-age", bad], env=env)
        assert refused.exit_code == 2 and said in refused.output, refused.output
        assert "Traceback" not in refused.output
    cleared = runner.invoke(
        cli, ["endpoints", "update", "billing", "--max-age", "none", "--json"], env=env
    )
    assert cleared.exit_code == 0 and json.loads(cleared.output)["max_age"] is None
