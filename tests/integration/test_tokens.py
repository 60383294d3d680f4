"""The management API's tokens (poller/access/tokens.py): shown once, kept as a hash, scoped,
expiring, revocable; and ``poller tokens`` in one line for every refusal."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner
from sqlalchemy import Engine, text

from poller.access import tokens
from poller.cli import cli
from poller.errors import InvalidInput, TokenExists, TokenNotFound, TokenRefused


def test_a_token_works_until_it_expires_or_is_revoked_and_is_kept_as_a_hash(
    engine: Engine,
) -> None:
    with engine.begin() as conn:
        made, token = tokens.create_token(conn, "acme-ci", "tenant:acme", read_only=True)
        _, admin = tokens.create_token(conn, "ops", "admin", expires="30d")
        _, brief = tokens.create_token(conn, "brief", "admin", expires=timedelta(seconds=1))
    assert token.startswith("wpt_") and len(token) == 47 and made.scope.tenant == "acme"
    with engine.connect() as conn:
        stored = conn.execute(text("SELECT * FROM poller_api_tokens")).mappings().all()
    assert not any(token in str(dict(row)) or admin in str(dict(row)) for row in stored)
    with engine.begin() as conn:
        found = tokens.authenticate(conn, token)
        assert (found.name, str(found.scope), found.read_only) == ("acme-ci", "tenant:acme", True)
        assert tokens.authenticate(conn, admin).scope.tenant is None
        conn.execute(text("UPDATE poller_api_tokens SET expires_at = now() - interval '1 s' "
                          "WHERE name = 'brief'"))  # fmt: skip
        tokens.revoke_token(conn, "acme-ci")
        again = tokens.revoke_token(conn, "acme-ci")  # changes nothing
    with engine.begin() as conn:
        for refused in (token, brief, token[:-1] + ("A" if token[-1] != "A" else "B"),
                        "", "wpt_", "Bearer " + admin, admin + "\n", "x" * 10_000):  # fmt: skip
            with pytest.raises(TokenRefused) as caught:
                tokens.authenticate(conn, refused)
            assert refused not in str(caught.value) or not refused
        listed = {t.name: t for t in tokens.list_tokens(conn)}
    assert {n: t.state() for n, t in listed.items()} == {
        "acme-ci": "revoked", "ops": "active", "brief": "expired",
    }  # fmt: skip
    assert listed["acme-ci"].revoked_at == again.revoked_at  # the first revoke's time
    assert listed["ops"].last_used_at is not None and listed["acme-ci"].last_used_at is not None


def test_names_scopes_and_lifetimes_are_checked(engine: Engine) -> None:
    with engine.begin() as conn:
        tokens.create_token(conn, "one", "admin")
        with pytest.raises(TokenExists):
            tokens.create_token(conn, "one", "tenant:acme")
        for name in ("", "-x", "a b", "é", "x" * 65, None):
            with pytest.raises(InvalidInput, match="token name"):
                tokens.create_token(conn, name, "admin")  # type: ignore[arg-type]
        for scope in ("", "Admin", "tenant:", "tenant:a b", "tenant:" + "x" * 256, "root", 7):
            with pytest.raises(InvalidInput):
                tokens.create_token(conn, "two", scope)  # type: ignore[arg-type]
        for expires in (timedelta(0), "-1d", "2000-01-01T00:00:00", "soon"):
            with pytest.raises(InvalidInput):
                tokens.create_token(conn, "two", "admin", expires=expires)
        for missing in ("nope", "\x00", "a\x00b", "x" * 500):  # PostgreSQL refuses a NUL
            with pytest.raises(TokenNotFound):
                tokens.revoke_token(conn, missing)
        made, _ = tokens.create_token(
            conn, "two", "tenant:acme", expires=datetime(2999, 1, 1, tzinfo=UTC)
        )
    assert made.expires_at == datetime(2999, 1, 1, tzinfo=UTC)


def test_the_cli_shows_a_token_once_and_refuses_in_one_line(engine: Engine, db_url: str) -> None:
    runner = CliRunner()
    env = {"POLLER_DATABASE_URL": db_url}

    def run(*args: str) -> tuple[int, str]:
        result = runner.invoke(cli, ["tokens", *args], env=env)
        assert "Traceback" not in result.output
        return result.exit_code, result.output

    code, out = run("create", "acme-portal", "--scope", "tenant:acme", "--read-only",
                    "--expires", "30d", "--json")  # fmt: skip
    made = json.loads(out)
    assert code == 0 and made["token"].startswith("wpt_") and made["scope"] == "tenant:acme"
    assert made["read_only"] is True and made["state"] == "active" and made["expires_at"]
    code, out = run("create", "ops", "--scope", "admin")
    assert code == 0 and out.splitlines()[0].startswith("wpt_") and "shown this once" in out
    with engine.begin() as conn:
        assert tokens.authenticate(conn, out.splitlines()[0]).name == "ops"
    code, out = run("list", "--json")
    assert code == 0 and [t["name"] for t in json.loads(out)] == ["acme-portal", "ops"]
    assert "wpt_" not in out
    code, out = run("list")
    assert code == 0 and "acme-portal" in out and "wpt_" not in out
    code, out = run("revoke", "ops")
    assert code == 0 and "revoked token 'ops'" in out
    for args, said in (
        (("create", "ops", "--scope", "admin"), "exists"),
        (("create", "x", "--scope", "root"), "admin, or tenant:NAME"),
        (("create", "x y", "--scope", "admin"), "token name"),
        (("create", "x", "--scope", "admin", "--expires", "yesterday"), "neither a duration"),
        (("create", "x"), "--scope"),
        (("revoke", "nope"), "no token named 'nope'"),
    ):
        code, out = run(*args)
        assert code in (1, 2) and said in out and len(out.strip().splitlines()) == 1, (args, out)
