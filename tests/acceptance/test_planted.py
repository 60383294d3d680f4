"""Credentials planted in an endpoint (its headers, its signing secret, its ed25519 key, its
client key) and in the settings (the proxy's password, the database's) must appear in no
command's output and no dashboard page — whatever the command, text or JSON."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner
from sqlalchemy import Engine, text
from starlette.testclient import TestClient

from poller.cli import cli
from poller.endpoints.registry import create_endpoint
from poller.rules.keyring import new_key
from poller.settings import default_settings, load_settings
from poller.web import auth
from poller.web.app import create_app
from tests.integration.helpers import seed
from tests.integration.pki import authority, issue

HEADER_VALUE = "planted-header-credential-93b1"
PROXY_PASSWORD = "planted-proxy-password-5c2e"
TOKEN = "dashboard-token-planted-0000"

COMMANDS = [
    ["endpoints", "list"],
    ["endpoints", "list", "--json"],
    ["endpoints", "show", "billing"],
    ["endpoints", "show", "billing", "--json"],
    ["endpoints", "show", "signer", "--json"],
    ["endpoints", "secret", "signer", "--json"],  # an ed25519 key: its public key only
    ["endpoints", "health"],
    ["endpoints", "health", "--json"],
    ["endpoints", "update", "billing", "--header", "X-Other: 1", "--json"],
    ["endpoints", "rotate-secret", "signer", "--yes", "--json"],
    ["endpoints", "pause", "billing", "--json"],
    ["endpoints", "resume", "billing"],
    ["admin", "stats", "--json"],
    ["admin", "failed", "--json"],
    ["admin", "show", "{0}", "--json"],
    ["admin", "cancel", "{1}", "--yes", "--json"],
    ["admin", "retry", "{1}", "--yes", "--json"],
    ["db", "current"],
]


def test_no_planted_credential_in_any_output(
    engine: Engine, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ca = authority()
    mine = issue(ca, "billing", client=True)
    key = new_key()
    env = {
        "POLLER_DATABASE_URL": db_url,
        "POLLER_SECRETS_KEY": key,
        "POLLER_ALLOW_PRIVATE_TARGETS": "true",
        "POLLER_PROXY_URL": f"http://egress:{PROXY_PASSWORD}@127.0.0.1:3128",
    }
    for name, value in env.items():  # the CLI reads them once per process: this one
        monkeypatch.setenv(name, value)
    default_settings.cache_clear()
    settings = load_settings(database_url=db_url, secrets_key=key)
    with engine.begin() as conn:
        billing = create_endpoint(
            conn, "billing", "https://127.0.0.1:9/h", allow_private=True,
            headers={"Authorization": f"Bearer {HEADER_VALUE}"}, client_cert=mine.cert,
            client_key=mine.key, ca_bundle=ca.cert, keyring=settings.keyring,
        )  # fmt: skip
        signer = create_endpoint(
            conn, "signer", "https://127.0.0.1:9/s", allow_private=True, signing="ed25519",
            keyring=settings.keyring,
        )  # fmt: skip
    ids = seed(engine, 3)
    with engine.begin() as conn:
        conn.execute(text("UPDATE poller_outbox SET status = 'failed', failed_at = now() "
                          "WHERE id = :id"), {"id": ids[0]})  # fmt: skip
    planted = [
        HEADER_VALUE,
        PROXY_PASSWORD,
        billing.secret,
        billing.secret.removeprefix("whsec_"),
        signer.secret,
        signer.secret.removeprefix("whsk_"),
        mine.key.splitlines()[1],
        "PRIVATE KEY",
        key,
    ]
    runner = CliRunner()
    for args in COMMANDS:
        result = runner.invoke(cli, [a.format(*ids) for a in args], env=env)
        assert result.exit_code in (0, 1), (args, result.output)  # 1: nothing matched
        assert "Traceback" not in result.output
        leaked = [p for p in planted if p in result.output]
        assert not leaked, (args, leaked)
    app = create_app(settings, engine, auth.Credentials(TOKEN))
    with TestClient(app, base_url="http://127.0.0.1:8188") as web:
        web.headers["authorization"] = f"Bearer {TOKEN}"
        pages = ["/", "/endpoints", "/endpoints/billing", "/endpoints/signer", "/failed",
                 f"/messages/{ids[0]}", f"/messages/{ids[1]}", "/keys",
                 "/endpoints/billing/disable"]  # fmt: skip
        for path in pages:
            page = web.get(path)
            assert page.status_code == 200, path
            body = re.sub(r"\s+", " ", page.text)
            assert not [p for p in planted if p in body], path
