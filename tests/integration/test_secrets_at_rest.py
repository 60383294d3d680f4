"""Signing secrets at rest (poller/rules/keyring.py): sealed with POLLER_SECRETS_KEY, opened with
any of its keys, re-sealed by ``rotate-key``; a poller that cannot open one does not start,
and a delivery that meets one later is a counted attempt, never an unsigned request."""

from __future__ import annotations

import base64
from datetime import timedelta

import pytest
from click.testing import CliRunner
from sqlalchemy import Engine, text

from poller.cli import cli
from poller.endpoints import keys as endpoint_keys
from poller.endpoints import registry as api
from poller.errors import ConfigurationError, SecretUnreadable
from poller.rules.keyring import Keyring
from poller.settings import default_settings, load_settings
from tests.conftest import make_endpoint
from tests.integration.helpers import attempts_of, row, seed, wait_for
from tests.integration.service_helpers import (
    counts,
    fast_settings,
    running_poller,
    running_receiver,
)

# Fixed keys (32 bytes, URL-safe base64, as Fernet makes them): parametrized test ids must be
# the same in every pytest-xdist worker.
K1 = "S0VZLW9uZS0tLS0tLS0tLS0tLS0tLS0tLS0tLS0tLTE="
K2 = "S0VZLXR3by0tLS0tLS0tLS0tLS0tLS0tLS0tLS0tLTI="


def stored(engine: Engine, name: str) -> tuple[str, str | None]:
    with engine.connect() as conn:
        found = conn.execute(
            text("SELECT secret, previous_secret FROM poller_endpoints WHERE name = :n"),
            {"n": name},
        ).one()
    return found.secret, found.previous_secret


# -- the keyring alone ----------------------------------------------------------------


def test_sealed_secrets_open_with_any_key_and_never_show_the_secret() -> None:
    secret = api.new_secret()
    sealed = Keyring([K1]).seal(secret)
    assert sealed.startswith("fernet:") and secret not in sealed
    assert secret.removeprefix("whsec_") not in sealed
    assert Keyring([K2, K1]).open(sealed) == secret  # an older key still opens
    assert Keyring([K1]).seal(secret) != sealed  # a fresh IV each time
    assert Keyring([]).seal(secret) == secret  # no key: plain text
    assert Keyring([K1]).open(secret) == secret  # plain secrets are read as they are


@pytest.mark.parametrize(
    ("keys", "stored_value", "reason"),
    [
        ([], "sealed", "POLLER_SECRETS_KEY is not set"),
        ([K2], "sealed", "key that is not in POLLER_SECRETS_KEY"),
        ([K1], "fernet:not-a-token", "key that is not in POLLER_SECRETS_KEY"),
        ([K1], "fernet:\u00e9", "key that is not in POLLER_SECRETS_KEY"),
        ([K1], "hunter2", "neither whsec_"),
    ],
)
def test_secrets_that_cannot_be_opened_say_why(
    keys: list[str], stored_value: str, reason: str
) -> None:
    value = Keyring([K1]).seal(api.new_secret()) if stored_value == "sealed" else stored_value
    with pytest.raises(SecretUnreadable, match=reason):
        Keyring(keys).open(value)


@pytest.mark.parametrize(
    ("value", "position"),
    [("not-a-key", "key 1 of 1"), (f"{K1},short", "key 2 of 2"), (f"{K1} {K2}x", "key 2 of 2")],
)
def test_a_bad_key_setting_names_its_position_never_its_value(value: str, position: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        load_settings(secrets_key=value)
    message = str(caught.value)
    assert message.startswith("POLLER_SECRETS_KEY: ") and position in message
    assert "short" not in message and "not-a-key" not in message and K1 not in message


def test_keys_are_comma_or_space_separated_and_never_repr() -> None:
    settings = load_settings(secrets_key=f" {K1}, {K2}\n")
    assert settings.keyring.key_count == 2
    assert K1 not in repr(settings) and K1 not in str(settings.model_dump())
    assert not load_settings(secrets_key="  ").keyring.seals


# -- stored endpoints -----------------------------------------------------------------


def test_endpoints_written_with_a_key_are_sealed_and_read_back_plain(engine: Engine) -> None:
    ring = Keyring([K1])
    created = make_endpoint(engine, "a", keyring=ring)
    secret, _ = stored(engine, "a")
    assert secret.startswith("fernet:") and created.secret not in secret
    with engine.connect() as conn:
        read = api.get_endpoint(conn, "a", keyring=ring)
        without_key = api.get_endpoint(conn, "a", keyring=Keyring())
    assert (read.secret, read.secret_sealed, read.secret_error) == (created.secret, True, None)
    assert without_key.secret == "" and without_key.secret_error is not None
    with pytest.raises(SecretUnreadable, match="endpoint 'a'"):
        without_key.signing_secrets(read.created_at)
    with engine.begin() as conn:  # rotation keeps both sealed and both signing
        _, new = endpoint_keys.rotate_secret(conn, "a", timedelta(hours=1), keyring=ring)
    secret, previous = stored(engine, "a")
    assert secret.startswith("fernet:") and previous is not None and previous.startswith("fernet:")
    with engine.connect() as conn:
        rotated = api.get_endpoint(conn, "a", keyring=ring)
    assert rotated.signing_secrets(rotated.updated_at) == [new, created.secret]


def test_reseal_moves_every_secret_to_the_first_key_and_back_to_plain(engine: Engine) -> None:
    plain = make_endpoint(engine, "plain", keyring=Keyring())
    old = make_endpoint(engine, "old", keyring=Keyring([K1]))
    with engine.begin() as conn:
        assert endpoint_keys.reseal_secrets(conn, keyring=Keyring([K2, K1])) == 2
    only_new = Keyring([K2])
    with engine.connect() as conn:
        found = {e.name: e for e in api.list_endpoints(conn, keyring=only_new)}
    assert {n: (e.secret, e.secret_sealed) for n, e in found.items()} == {
        "plain": (plain.secret, True),
        "old": (old.secret, True),
    }
    with engine.begin() as conn:
        assert endpoint_keys.reseal_secrets(conn, plain=True, keyring=only_new) == 2
    assert stored(engine, "plain") == (plain.secret, None)
    assert stored(engine, "old") == (old.secret, None)


def test_reseal_changes_nothing_when_one_secret_cannot_be_opened(engine: Engine) -> None:
    make_endpoint(engine, "a", keyring=Keyring([K1]))
    make_endpoint(engine, "b", keyring=Keyring([K2]))
    before = stored(engine, "a"), stored(engine, "b")
    with pytest.raises(SecretUnreadable, match="endpoint 'b'"), engine.begin() as conn:
        endpoint_keys.reseal_secrets(conn, keyring=Keyring([K1]))
    assert (stored(engine, "a"), stored(engine, "b")) == before
    with pytest.raises(SecretUnreadable, match="not set"), engine.begin() as conn:
        endpoint_keys.reseal_secrets(conn, keyring=Keyring())


# -- the poller -----------------------------------------------------------------------


async def test_a_poller_signs_with_sealed_secrets(engine: Engine, db_url: str) -> None:
    ring = Keyring([K1])
    async with running_receiver() as (receiver, url):
        created = make_endpoint(engine, "a", url=url, keyring=ring)
        receiver.keys = [base64.b64decode(created.secret.removeprefix("whsec_"))]
        seed(engine, 20, "a")
        async with running_poller(db_url, fast_settings(secrets_key=f"{K2},{K1}")):

            async def delivered() -> bool:
                return counts(engine).get("delivered", 0) == 20

            await wait_for(delivered, timeout=20)
    assert receiver.stats.bad_signatures == 0 and receiver.stats.applied == 20


@pytest.mark.parametrize("key", [None, K2])
async def test_a_poller_that_cannot_open_a_secret_does_not_start(
    engine: Engine, db_url: str, key: str | None
) -> None:
    make_endpoint(engine, "a", keyring=Keyring([K1]))
    with pytest.raises(ConfigurationError, match="endpoint a: the secret is encrypted"):
        async with running_poller(db_url, fast_settings(secrets_key=key)):
            pass  # pragma: no cover - it must not start


async def test_a_secret_sealed_with_a_foreign_key_later_is_a_counted_attempt(
    engine: Engine, db_url: str
) -> None:
    """An endpoint written after the poller started, with a key the poller lacks: its
    messages are never sent unsigned, each delivery is an attempt, then failed."""
    async with (
        running_receiver() as (receiver, url),
        running_poller(db_url, fast_settings(secrets_key=K1)),
    ):
        make_endpoint(engine, "late", url=url, max_attempts=2, keyring=Keyring([K2]))
        (msg_id,) = seed(engine, 1, "late")

        async def failed() -> bool:
            return counts(engine).get("failed", 0) == 1

        await wait_for(failed, timeout=20)
    assert row(engine, msg_id).attempts == 2 and receiver.stats.received == 0
    assert {a.error_class for a in attempts_of(engine, msg_id)} == {"SecretUnreadable"}


# -- the CLI --------------------------------------------------------------------------


def _cli(db_url: str, *args: str, key: str | None = None) -> tuple[int, str, str]:
    env = {"POLLER_DATABASE_URL": db_url, "POLLER_LOG_FORMAT": "json"}
    if key is not None:
        env["POLLER_SECRETS_KEY"] = key
    default_settings.cache_clear()  # one process per command in real life
    result = CliRunner().invoke(cli, list(args), env=env)
    return result.exit_code, result.stdout, result.stderr


def test_cli_encrypts_lists_shows_and_rotates(engine: Engine, db_url: str) -> None:
    code, out, err = _cli(db_url, "endpoints", "add", "a", "http://127.0.0.1:9/", key=K1)
    assert code == 0, err
    secret = out.rsplit(" ", 1)[1].strip()
    assert stored(engine, "a")[0].startswith("fernet:")
    make_endpoint(engine, "b", keyring=Keyring())  # written without a key

    code, out, err = _cli(db_url, "endpoints", "list", key=K1)
    assert code == 0 and "encrypted" in out and "plain text" in out
    assert "note: 1 of 2 signing secrets stored in plain text" in err

    code, out, err = _cli(db_url, "endpoints", "secret", "a", key=K1)
    assert (code, out) == (0, secret + "\n"), err
    assert '"audit": "secret_shown"' in err and '"endpoint": "a"' in err
    assert secret not in err and secret.removeprefix("whsec_") not in err

    code, out, err = _cli(db_url, "endpoints", "secret", "a")  # no key here
    assert code == 2 and out == "" and "POLLER_SECRETS_KEY is not set" in err
    assert len(err.strip().splitlines()) == 1

    code, out, err = _cli(db_url, "endpoints", "rotate-key", "--yes", key=f"{K2},{K1}")
    assert (code, out) == (
        0,
        "2 endpoints' secrets stored encrypted with the first key of POLLER_SECRETS_KEY\n",
    ), err
    code, out, _ = _cli(db_url, "endpoints", "secret", "a", key=K2)
    assert out == secret + "\n"
    code, out, err = _cli(db_url, "endpoints", "list", "--json", key=K2)
    assert '"secret_encrypted": true' in out and '"secret_encrypted": false' not in out
    assert "note:" not in err


def test_cli_key_errors_are_one_line(db_url: str) -> None:
    code, out, err = _cli(db_url, "endpoints", "rotate-key", "--yes")
    assert code == 2 and "POLLER_SECRETS_KEY is not set" in err
    code, out, err = _cli(db_url, "endpoints", "list", key="definitely-not-a-key")
    assert code == 2 and err.strip().splitlines() == [err.strip()]
    assert "key 1 of 1 is not a Fernet key" in err and "definitely" not in err
    code, out, _ = _cli(db_url, "endpoints", "new-key")
    assert code == 0 and Keyring.from_value(out.strip()).seals
