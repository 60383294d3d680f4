"""One delivery attempt against real HTTP servers on 127.0.0.1: headers, signing, outcomes."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest
from standardwebhooks import Webhook

from poller.deliver.aiohttp_sender import AiohttpSender
from poller.deliver.delivery import lookup, send
from poller.deliver.wire import Sender
from poller.endpoints.registry import Endpoint, new_secret
from poller.local.receiver import Faults, Receiver
from poller.rules.outcomes import ClaimedMessage, LookupAnswer, Verdict
from tests.integration import senders, servers

NOW = datetime.now(UTC)


def _endpoint(url: str, secret: str | None = None, lookup_url: str | None = None) -> Endpoint:
    return Endpoint(
        id=1,
        name="e",
        url=url,
        lookup_url=lookup_url,
        enabled=True,
        disabled_reason=None,
        max_attempts=None,
        timeout=None,
        max_in_flight=None,
        bucket=0,
        created_at=NOW,
        updated_at=NOW,
        secret=secret or new_secret(),
    )


def _message(key: str = "invoice:42") -> ClaimedMessage:
    return ClaimedMessage(
        id=7,
        endpoint_id=1,
        bucket=0,
        event_type="e",
        payload='{"a": 1}',
        idempotency_key=key,
        attempts=1,
        max_attempts=10,
        claim_token=1,
        claim_expires_at=NOW,
        needs_lookup=False,
        created_at=NOW,
        endpoint_updated_at=NOW,
    )


@pytest.fixture(params=senders.KINDS)
async def client(request: pytest.FixtureRequest) -> AsyncIterator[Sender]:
    sender = senders.make(request.param, allow_private=True)
    yield sender
    await sender.aclose()


async def _send(client: Sender, url: str, timeout: float = 2.0, **kw: object):  # type: ignore[no-untyped-def]
    return await send(
        client,
        _endpoint(url, **kw),  # type: ignore[arg-type]
        _message(),
        timeout=timeout,
        user_agent="webhook-poller/test",
    )


async def test_signature_verifies_with_standardwebhooks(client: Sender) -> None:
    seen: dict[str, object] = {}

    async def capture(reader, writer):  # type: ignore[no-untyped-def]
        raw = await servers.read_request(reader)
        head, _, body = raw.partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        seen["headers"] = {k.lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:])}
        seen["body"] = body
        writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")
        await writer.drain()

    secret = new_secret()
    async with servers.raw_server(capture) as url:
        attempt = await _send(client, url, secret=secret)
    assert attempt.verdict is Verdict.DELIVERED and attempt.status_code == 204
    headers = seen["headers"]
    assert isinstance(headers, dict)
    assert headers["webhook-id"] == headers["idempotency-key"] == "invoice:42"
    assert headers["content-type"] == "application/json"
    assert headers["user-agent"] == "webhook-poller/test"
    Webhook(secret).verify(seen["body"], headers)  # raises if the signature is wrong


@pytest.mark.parametrize(
    ("handler", "verdict", "status"),
    [
        (servers.answer(200), Verdict.DELIVERED, 200),
        (servers.answer(410), Verdict.GONE, 410),
        (servers.answer(500), Verdict.RETRY, 500),
        (servers.answer(404), Verdict.RETRY, 404),
        (servers.answer(302, "Location: http://10.0.0.1/\r\n"), Verdict.RETRY, 302),
        (servers.close_after_request, Verdict.UNKNOWN, None),
        (servers.never_answers, Verdict.UNKNOWN, None),
        (servers.bad_status_line, Verdict.UNKNOWN, None),
    ],
)
async def test_outcome_classes(client: Sender, handler, verdict, status) -> None:  # type: ignore[no-untyped-def]
    # The budget is only used up by a receiver that never answers: 0.5 s once ran out
    # before the request was written, and once before a 200 was read, on two cores
    # loaded by the suite. The others answer at once, whatever the budget.
    timeout = 2.0
    async with servers.raw_server(handler) as url:
        attempt = await _send(client, url, timeout=timeout)
    assert (attempt.verdict, attempt.status_code) == (verdict, status), attempt


async def test_refused_connection_is_known_not_sent(client: Sender) -> None:
    attempt = await _send(client, servers.free_closed_port())
    assert attempt.verdict is Verdict.RETRY and attempt.status_code is None
    assert attempt.error_class == "ConnectError"


async def test_close_after_reading_is_unknown_not_connect_timeout(client: Sender) -> None:
    # httpx-aiohttp files this as ConnectTimeout (not sent); it may have been processed.
    async with servers.raw_server(servers.close_after_request) as url:
        attempt = await _send(client, url)
    assert attempt.verdict is Verdict.UNKNOWN
    assert attempt.error_class == "RemoteProtocolError"


async def test_retry_after_is_read_on_429_and_503(client: Sender) -> None:
    for status in (429, 503):
        async with servers.raw_server(servers.answer(status, "Retry-After: 120\r\n")) as url:
            attempt = await _send(client, url)
        assert (attempt.verdict, attempt.retry_after) == (Verdict.RETRY, 120.0)


async def test_a_retry_after_that_is_not_text_is_ignored(client: Sender) -> None:
    handler = servers.answer(429, "Retry-After: \udcff\udcfe1\r\n")
    async with servers.raw_server(handler) as url:
        attempt = await _send(client, url)
    assert (attempt.verdict, attempt.status_code) == (Verdict.RETRY, 429), attempt


async def test_endless_body_is_cut_at_the_cap(client: Sender) -> None:
    async with servers.raw_server(servers.endless_body) as url:
        attempt = await _send(client, url, timeout=5)
    assert attempt.verdict is Verdict.DELIVERED
    assert attempt.response_excerpt is not None and len(attempt.response_excerpt) == 2048
    assert attempt.duration_ms < 5000


async def test_invalid_utf8_and_nul_in_excerpt_are_stored_safely(client: Sender) -> None:
    async with servers.raw_server(servers.answer(500, body=b"\xff\xfe bad \x00 nul")) as url:
        attempt = await _send(client, url)
    assert attempt.response_excerpt is not None and "\x00" not in attempt.response_excerpt


async def test_private_targets_refused_when_not_allowed() -> None:
    for client in (senders.make(kind) for kind in senders.KINDS):
        for url in ("http://127.0.0.1:9/", "http://localhost:9/", "http://[::1]:9/"):
            attempt = await _send(client, url)
            assert attempt.verdict is Verdict.RETRY
            said = attempt.error_message or ""  # a tenant reads it: no operator's setting
            assert "refused" in said and "POLLER_ALLOW_PRIVATE_TARGETS" not in said
        await client.aclose()


async def test_lookup_answers(client: Sender) -> None:
    receiver = Receiver(faults=Faults())
    port = await receiver.start()
    try:
        base = f"http://127.0.0.1:{port}"
        endpoint = _endpoint(f"{base}/hook", lookup_url=f"{base}/webhooks/{{idempotency_key}}")
        answer, _ = await lookup(client, endpoint, _message("a/b c"), timeout=2, user_agent="t")
        assert answer is LookupAnswer.NOT_FOUND
        await send(client, endpoint, _message("a/b c"), timeout=2, user_agent="t")
        answer, attempt = await lookup(
            client, endpoint, _message("a/b c"), timeout=2, user_agent="t"
        )
        assert answer is LookupAnswer.FOUND and attempt.verdict is Verdict.DELIVERED
    finally:
        await receiver.stop()


@pytest.mark.parametrize("kind", senders.KINDS)
async def test_bad_tls_certificate_is_known_not_sent(tmp_path, kind: str) -> None:  # type: ignore[no-untyped-def]
    import ssl
    import subprocess

    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    sender = senders.make(kind, allow_private=True)
    try:
        async with servers.raw_server(servers.answer(200), tls=context) as url:
            attempt = await _send(sender, f"{url}/hook")
    finally:
        await sender.aclose()
    assert attempt.verdict is Verdict.RETRY and attempt.error_class == "TLSError"
    assert "unknown CA" in (attempt.error_message or "")
    if kind != "reqwest":  # OpenSSL tells a self-signed certificate apart; rustls does not
        assert "unknown CA (a self-signed certificate" in (attempt.error_message or "")


def test_permanent_statuses_fail_at_once() -> None:
    from poller.deliver.delivery import classify_status

    assert classify_status(422, permanent=(400, 422)) is Verdict.FAILED
    assert classify_status(422) is Verdict.RETRY
    assert classify_status(410, permanent=(400,)) is Verdict.GONE


def _never_accepts() -> tuple[socket.socket, int, list[socket.socket]]:
    """A listening socket whose backlog is full: a new connection's SYN is never answered."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    port = server.getsockname()[1]
    fillers = []
    for _ in range(8):
        filler = socket.socket()
        filler.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            filler.connect(("127.0.0.1", port))
        fillers.append(filler)
    return server, port, fillers


@pytest.mark.parametrize("kind", senders.KINDS)
async def test_a_host_that_never_accepts_is_a_connect_timeout_not_unknown(kind: str) -> None:
    """A blackholed host was never sent anything: retry, no lookup (the delivery contract)."""
    server, port, fillers = _never_accepts()
    sender = senders.make(kind, allow_private=True, connect_timeout=0.3)
    try:
        attempt = await _send(sender, f"http://127.0.0.1:{port}/hook", timeout=2.0)
    finally:
        await sender.aclose()
        for s in (server, *fillers):
            s.close()
    assert (attempt.verdict, attempt.error_class) == (Verdict.RETRY, "ConnectTimeout")
    assert attempt.duration_ms < 1500  # the connect budget, not the whole timeout


async def test_connect_errors_read_plainly(client: Sender) -> None:
    from poller.local.embedded import free_port

    port = free_port()
    attempt = await _send(client, f"http://127.0.0.1:{port}/hook")
    assert attempt.verdict is Verdict.RETRY and "ssl:default" not in (attempt.error_message or "")
    if isinstance(client, AiohttpSender):
        assert (attempt.error_message or "").startswith(f"cannot connect to 127.0.0.1:{port}: ")
