"""An endpoint's TLS (poller/endpoints/tls.py) against real TLS receivers on 127.0.0.1, through both
HTTP clients: a private CA, mutual TLS, and each failure as "not sent" with its reason."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import Engine, text

from poller.cli import cli
from poller.deliver.delivery import send
from poller.deliver.wire import Sender
from poller.endpoints.keys import reseal_secrets
from poller.endpoints.registry import create_endpoint, get_endpoint, update_endpoint
from poller.endpoints.tls import check_tls
from poller.errors import InvalidEndpoint
from poller.rules.keyring import Keyring, new_key
from poller.rules.outcomes import Verdict
from tests.integration import senders, servers
from tests.integration.pki import Issued, authority, issue, tls_server
from tests.integration.test_delivery import _endpoint, _message
from tests.integration.test_delivery import client as client  # the fixture: both senders


async def _send(sender: Sender, url: str, **tls: str | None):  # type: ignore[no-untyped-def]
    endpoint = dataclasses.replace(_endpoint(url + "/hook"), **tls)
    return await send(sender, endpoint, _message(), timeout=5, user_agent="t")


async def test_a_private_ca_is_trusted_for_its_endpoint_only(
    client: Sender, tmp_path: Path
) -> None:
    ca = authority()
    async with tls_server(tmp_path, issue(ca)) as url:
        refused = await _send(client, url)
        trusted = await _send(client, url, ca_bundle=ca.cert)
        other = await _send(client, url, ca_bundle=authority("Another CA").cert)
    assert refused.verdict is Verdict.RETRY and refused.error_class == "TLSError"
    assert refused.error_message.startswith("TLS: unknown CA"), refused.error_message
    assert trusted.verdict is Verdict.DELIVERED
    assert other.error_message.startswith("TLS: unknown CA")


@pytest.mark.parametrize(
    ("server", "said"),
    [
        (lambda ca: issue(ca, expired=True), "TLS: the receiver's certificate has expired"),
        (lambda ca: issue(ca, "other.example"), "TLS: hostname mismatch"),
    ],
)
async def test_a_bad_receiver_certificate_reads_plainly(
    client: Sender,
    tmp_path: Path,
    server,
    said: str,  # type: ignore[no-untyped-def]
) -> None:
    ca = authority()
    async with tls_server(tmp_path, server(ca)) as url:
        attempt = await _send(client, url, ca_bundle=ca.cert)
    assert attempt.verdict is Verdict.RETRY and attempt.error_class == "TLSError"
    assert attempt.error_message.startswith(said), attempt.error_message


@pytest.mark.parametrize("tls12", [True, False], ids=["tls1.2", "tls1.3"])
async def test_mutual_tls_sends_the_client_certificate(
    client: Sender, tmp_path: Path, tls12: bool
) -> None:
    """Accepted with the right certificate. Refused without one, or with a stranger's:
    under TLS 1.2 the receiver refuses inside the handshake — known not sent, and said
    so; under TLS 1.3 the client has written the request when the refusal comes (often
    as a reset that drops the alert), so it is unknown: retried, looked up, never lost."""
    ca, clients = authority(), authority("Client CA")
    mine, stranger = issue(clients, "billing", client=True), issue(authority(), "x", client=True)
    async with tls_server(tmp_path, issue(ca), client_ca=clients, tls12=tls12) as url:
        accepted = await _send(
            client, url, ca_bundle=ca.cert, client_cert=mine.cert, client_key=mine.key
        )
        without = await _send(client, url, ca_bundle=ca.cert)
        wrong = await _send(
            client, url, ca_bundle=ca.cert, client_cert=stranger.cert, client_key=stranger.key
        )
    assert accepted.verdict is Verdict.DELIVERED
    for attempt in (without, wrong):
        if tls12:
            assert attempt.verdict is Verdict.RETRY, attempt
            assert attempt.error_class == "TLSError", attempt
            assert "client certificate" in attempt.error_message, attempt
        else:
            assert attempt.verdict in (Verdict.RETRY, Verdict.UNKNOWN), attempt


def _bad_tls() -> list[tuple[dict[str, str | None], str]]:
    ca = authority()
    mine, other = issue(ca, "c", client=True), issue(ca, "d", client=True)
    return [
        ({"client_cert": mine.cert, "client_key": None}, "needs its key"),
        ({"client_cert": None, "client_key": mine.key}, "needs its key"),
        ({"client_cert": mine.cert, "client_key": other.key}, "not the client certificate's key"),
        ({"client_cert": mine.cert, "client_key": mine.encrypted_key(b"pw")}, "is encrypted"),
        ({"client_cert": mine.cert, "client_key": "junk"}, "not a PEM private key"),
        ({"client_cert": "junk", "client_key": mine.key}, "not a PEM certificate"),
        ({"client_cert": "", "client_key": mine.key}, "is empty"),
        ({"client_cert": mine.cert + "\x00", "client_key": mine.key}, "holds a NUL"),
        ({"client_cert": mine.cert, "client_key": mine.key + "\x00"}, "holds a NUL"),
        ({"client_cert": issue(ca, "e", client=True, expired=True).cert,
          "client_key": mine.key}, "not the client certificate's key"),
        ({"ca_bundle": "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"},
         "not a PEM certificate"),
        ({"ca_bundle": "x" * (600 * 1024)}, "larger than 512 KiB"),
    ]  # fmt: skip


@pytest.mark.parametrize(("given", "said"), _bad_tls())
def test_bad_tls_settings_are_refused_without_quoting_the_key(
    given: dict[str, str | None], said: str
) -> None:
    values = {"client_cert": None, "client_key": None, "ca_bundle": None, **given}
    with pytest.raises(InvalidEndpoint, match=said) as refused:
        check_tls(values["client_cert"], values["client_key"], values["ca_bundle"])
    if values["client_key"] and len(values["client_key"]) > 80:
        assert values["client_key"][40:80] not in str(refused.value)


def test_an_expired_client_certificate_is_refused() -> None:
    ca = authority()
    old = issue(ca, "c", client=True, expired=True)
    with pytest.raises(InvalidEndpoint, match="expired on"):
        check_tls(old.cert, old.key, None)


def _files(tmp: Path, issued: Issued, ca: Issued) -> dict[str, Path]:
    files = {"cert": tmp / "c.pem", "key": tmp / "k.pem", "ca": tmp / "ca.pem"}
    files["cert"].write_text(issued.cert)
    files["key"].write_text(issued.key)
    files["ca"].write_text(ca.cert)
    files["other"] = tmp / "other.pem"
    files["other"].write_text(issue(ca, "other", client=True).cert)
    return files


def test_the_key_is_sealed_at_rest_and_never_shown(
    engine: Engine, db_url: str, tmp_path: Path
) -> None:
    ca, clients = authority(), authority("Client CA")
    mine = issue(clients, "billing", client=True)
    files = _files(tmp_path, mine, ca)
    key = new_key()
    env = {
        "POLLER_DATABASE_URL": db_url,
        "POLLER_ALLOW_PRIVATE_TARGETS": "true",
        "POLLER_SECRETS_KEY": key,
    }
    runner = CliRunner()

    def run(*args: str) -> tuple[int, str]:
        result = runner.invoke(cli, list(args), env=env)
        assert "Traceback" not in result.output
        return result.exit_code, result.output

    code, out = run(
        "endpoints", "add", "billing", "https://127.0.0.1:9/h", "--client-cert",
        str(files["cert"]), "--client-key", str(files["key"]), "--ca-bundle", str(files["ca"]),
        "--json",
    )  # fmt: skip
    assert code == 0, out
    shown = json.loads(out)["tls"]
    assert shown["client_cert"]["subject"] == "CN=billing" and shown["ca_bundle"] == [
        "CN=Test Root CA"
    ]
    outputs = [out]
    for args in (("endpoints", "show", "billing"), ("endpoints", "show", "billing", "--json"),
                 ("endpoints", "list", "--json")):  # fmt: skip
        code, out = run(*args)
        assert code == 0, out
        outputs.append(out)
    assert "CN=billing" in outputs[1]
    secret_part = mine.key.splitlines()[1]
    assert not [o for o in outputs if secret_part in o or "PRIVATE KEY" in o]
    with engine.connect() as conn:
        stored = conn.execute(text("SELECT client_key FROM poller_endpoints")).scalar_one()
        assert stored.startswith("fernet:")
        assert get_endpoint(conn, "billing", keyring=Keyring([key])).client_key == mine.key
    for args, said in (
        (("--client-cert", str(tmp_path / "nope.pem")), "does not exist"),
        (("--client-cert", str(files["other"])), "not the client certificate's key"),
        (("--client-key", str(files["cert"])), "not a PEM private key"),
    ):
        code, out = run("endpoints", "update", "billing", *args)
        assert code == 2 and said in out, (args, out)
        assert secret_part not in out
    code, out = run("endpoints", "update", "billing", "--client-cert", "none", "--json")
    assert code == 0 and json.loads(out)["tls"]["client_cert"] is None
    with engine.begin() as conn:
        assert update_endpoint(conn, "billing", ca_bundle=ca.cert, keyring=Keyring([key])).tls
        update_endpoint(
            conn, "billing", client_cert=mine.cert, client_key=mine.key, keyring=Keyring([key])
        )
        reseal_secrets(conn, plain=True, keyring=Keyring([key]))  # rotate-key --plain
        stored = conn.execute(text("SELECT client_key FROM poller_endpoints")).scalar_one()
    assert stored == mine.key  # in plain text again, whole


async def test_an_endpoint_created_with_tls_delivers_through_the_poller_path(
    engine: Engine, client: Sender, tmp_path: Path
) -> None:
    ca, clients = authority(), authority("Client CA")
    mine = issue(clients, "billing", client=True)
    async with tls_server(tmp_path, issue(ca), client_ca=clients) as url:
        with engine.begin() as conn:
            created = create_endpoint(
                conn, "billing", url + "/hook", client_cert=mine.cert, client_key=mine.key,
                ca_bundle=ca.cert,
            )  # fmt: skip
        attempt = await send(client, created.endpoint, _message(), timeout=5, user_agent="t")
    assert attempt.verdict is Verdict.DELIVERED


@pytest.mark.parametrize("tls12", [True, False], ids=["tls1.2", "tls1.3"])
async def test_reqwest_presents_the_client_certificate_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tls12: bool
) -> None:
    """Without a CA bundle the reqwest sender does mutual TLS in Rust (with one, the
    aiohttp sender does: poller/deliver/reqwest_sender.py). The receiver's CA is made a system
    root for the test (rustls reads SSL_CERT_FILE when a client first verifies)."""
    ca, clients = authority(), authority("Client CA")
    mine, stranger = issue(clients, "billing", client=True), issue(authority(), "x", client=True)
    (tmp_path / "roots.pem").write_text(ca.cert)
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "roots.pem"))
    sender = senders.make("reqwest", allow_private=True)
    try:
        async with tls_server(tmp_path, issue(ca), client_ca=clients, tls12=tls12) as url:
            accepted = await _send(sender, url, client_cert=mine.cert, client_key=mine.key)
            without = await _send(sender, url)
            wrong = await _send(sender, url, client_cert=stranger.cert, client_key=stranger.key)
    finally:
        await sender.aclose()
    assert accepted.verdict is Verdict.DELIVERED, accepted
    for attempt in (without, wrong):
        if tls12:
            assert (attempt.verdict, attempt.error_class) == (Verdict.RETRY, "TLSError"), attempt
            assert "client certificate" in (attempt.error_message or ""), attempt
        else:
            assert attempt.verdict in (Verdict.RETRY, Verdict.UNKNOWN), attempt


def _ed448_client_certificate() -> tuple[str, str]:
    """A self-signed client certificate with an Ed448 key: the endpoint checks accept it
    (OpenSSL can use it), rustls cannot read it. (Not DSA: cryptography 51 deprecates
    generating DSA keys, and its warning is an error under the suite's filter.)"""
    from datetime import UTC, datetime, timedelta

    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed448
    from cryptography.x509.oid import NameOID

    key = ed448.Ed448PrivateKey.generate()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ed448-client")])
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now - timedelta(minutes=1))
        .not_valid_after(now + timedelta(days=1))
        .sign(key, None)
    )
    return (
        cert.public_bytes(serialization.Encoding.PEM).decode(),
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ).decode(),
    )


async def test_a_client_key_rustls_cannot_read_goes_through_aiohttp() -> None:
    """Not a crash per attempt: the reqwest sender hands such an endpoint to aiohttp."""
    cert, key = _ed448_client_certificate()
    check_tls(cert, key, None)  # accepted when the endpoint is saved
    sender = senders.make("reqwest", allow_private=True)
    try:
        for _ in range(2):  # the second finds the endpoint remembered
            async with servers.raw_server(servers.answer(200)) as url:  # one answer each
                attempt = await _send(sender, url, client_cert=cert, client_key=key)
            assert attempt.verdict is Verdict.DELIVERED, attempt
    finally:
        await sender.aclose()
