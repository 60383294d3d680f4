"""Asymmetric signatures (poller/rules/signing.py): an ed25519 endpoint's webhooks verify with its
public key alone, a rotation (even across schemes) signs with both keys, and the private key
never leaves the poller."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta

import pytest
from click.testing import CliRunner
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from poller import Message, enqueue_many
from poller.cli import cli
from poller.endpoints.keys import rotate_secret
from poller.endpoints.registry import (
    create_endpoint,
    get_endpoint,
    new_secret,
    update_endpoint,
)
from poller.errors import InvalidEndpoint
from poller.local.receiver import Receiver
from poller.rules.signing import Verifier, public_key, sign
from tests.integration.helpers import seed, wait_for
from tests.integration.service_helpers import fast_settings, running_poller


def _verifies(keys: list[str], signature: str, body: bytes = b"{}", stamp: int = 0) -> bool:
    stamp = stamp or int(time.time())
    return Verifier(keys).verify(b"msg_1", str(stamp).encode(), signature.encode(), body, stamp)


def test_v1a_is_an_ed25519_signature_the_public_key_alone_checks() -> None:
    key = new_secret("ed25519")
    public = public_key(key)
    assert key.startswith("whsk_") and public is not None and public.startswith("whpk_")
    stamp = int(time.time())
    signature = sign([key], "msg_1", stamp, b'{"a":1}')
    version, _, value = signature.partition(",")
    raw_public = base64.b64decode(public.removeprefix("whpk_"))
    # checked by cryptography directly, not by our verifier: raises if it is wrong
    Ed25519PublicKey.from_public_bytes(raw_public).verify(
        base64.b64decode(value), f"msg_1.{stamp}.".encode() + b'{"a":1}'
    )
    assert version == "v1a" and _verifies([public], signature, b'{"a":1}', stamp)
    assert not _verifies([public], signature, b'{"a":2}', stamp)  # another body
    assert not _verifies([public_key(new_secret("ed25519")) or ""], signature, b'{"a":1}', stamp)
    assert not _verifies([public], signature, b'{"a":1}', stamp - 301)  # stale timestamp


def test_during_a_rotation_across_schemes_either_key_verifies() -> None:
    old, new = new_secret(), new_secret("ed25519")
    signature = sign([new, old], "msg_1", int(time.time()), b"{}")
    assert signature.startswith("v1a,") and " v1," in signature
    assert _verifies([old], signature) and _verifies([public_key(new) or ""], signature)
    assert not _verifies([new_secret()], signature)
    for garbage in ("v1a,", "v1a,!!!", "v1a," + "A" * 88, "v2,x", ""):
        assert not _verifies([old, public_key(new) or ""], garbage)


@pytest.mark.parametrize(
    ("keys", "message"),
    [(["whpk_abc"], "base64 of 32 bytes"), (["nope"], "whsec_"), (["whsec_"], "whsec_")],
)
def test_a_malformed_verification_key_is_refused_once(keys: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Verifier(keys)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"signing": "rsa"}, "signing must be one of hmac-sha256, ed25519"),
        ({"signing": "ed25519", "secret": new_secret()}, "is a hmac-sha256 key, not ed25519"),
        ({"secret": "whsk_" + base64.b64encode(b"x" * 31).decode()}, "32-byte seed"),
        ({"secret": "whsk_not base64"}, "32-byte seed"),
    ],
)
def test_bad_signing_settings_are_refused(engine: Engine, kwargs: dict, message: str) -> None:  # type: ignore[type-arg]
    with engine.begin() as conn, pytest.raises(InvalidEndpoint, match=message):
        create_endpoint(conn, "billing", "http://127.0.0.1:9/h", **kwargs)


async def test_a_receiver_holding_only_the_public_key_verifies_every_delivery(
    engine: Engine, db_url: str
) -> None:
    with engine.begin() as conn:
        endpoint = create_endpoint(conn, "billing", "http://127.0.0.1:9/h", signing="ed25519")
    (public,) = endpoint.endpoint.public_keys
    receiver = Receiver([public])
    port = await receiver.start()

    def applied(n: int) -> Callable[[], Awaitable[bool]]:
        async def check() -> bool:
            return receiver.stats.applied == n

        return check

    try:
        with engine.begin() as conn:
            update_endpoint(conn, "billing", url=f"http://127.0.0.1:{port}/hook")
        seed(engine, 20)
        async with running_poller(db_url, fast_settings()):
            await wait_for(applied(20), timeout=15)
            with engine.begin() as conn:  # to HMAC: both sign during the overlap
                _, secret = rotate_secret(
                    conn, "billing", timedelta(hours=1), signing="hmac-sha256"
                )
            receiver.verifier = Verifier([secret])  # the receiver moves to the new key at once
            with Session(engine) as session, session.begin():
                enqueue_many(session, [Message("billing", "t", {}, f"after:{i}") for i in range(5)])
            await wait_for(applied(25), timeout=15)
    finally:
        await receiver.stop()
    assert receiver.stats.bad_signatures == 0
    with engine.connect() as conn:
        assert get_endpoint(conn, "billing").signing == "hmac-sha256"


def test_the_cli_shows_the_public_key_and_never_the_private_one(
    engine: Engine, db_url: str
) -> None:
    env = {"POLLER_DATABASE_URL": db_url, "POLLER_ALLOW_PRIVATE_TARGETS": "true"}
    runner = CliRunner()

    def run(*args: str) -> tuple[int, str]:
        result = runner.invoke(cli, list(args), env=env)
        return result.exit_code, result.output

    code, out = run(
        "endpoints", "add", "billing", "http://127.0.0.1:9/h", "--signing", "ed25519", "--json"
    )
    assert code == 0, out
    added = json.loads(out)
    assert "secret" not in added and added["signing"] == "ed25519"
    (public,) = added["public_keys"]
    outputs = [out]
    for args in (
        ("endpoints", "add", "other", "http://127.0.0.1:9/h", "--signing", "ed25519"),
        ("endpoints", "show", "billing"),
        ("endpoints", "show", "billing", "--json"),
        ("endpoints", "list", "--json"),
        ("endpoints", "secret", "billing"),
        ("endpoints", "secret", "billing", "--json"),
        ("endpoints", "rotate-secret", "billing", "--yes"),
        ("endpoints", "rotate-secret", "billing", "--yes", "--json"),
    ):
        code, out = run(*args)
        assert code == 0, (args, out)
        outputs.append(out)
    assert public in outputs[2] and public in outputs[5]
    rotated = json.loads(outputs[-1])
    assert "secret" not in rotated and rotated["public_key"].startswith("whpk_")
    assert not [o for o in outputs if "whsk_" in o]
    with engine.connect() as conn:
        assert len(get_endpoint(conn, "billing").public_keys) == 2  # both during the overlap
    code, out = run("endpoints", "add", "x", "http://127.0.0.1:9/h", "--signing", "rsa")
    assert code == 2 and "'rsa' is not one of" in out
