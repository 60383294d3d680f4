"""Hostile input, each with its exact behaviour: the API, the CLI's URLs, hostile receivers."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from poller import InvalidIdempotencyKey, PayloadTooLarge, UnknownEndpoint, enqueue
from poller.deliver.delivery import send
from poller.endpoints.registry import CreatedEndpoint
from poller.endpoints.urls import check_url
from poller.errors import InvalidEndpoint
from poller.rules.outcomes import Verdict
from tests.integration import senders, servers
from tests.integration.test_delivery import _endpoint, _message


def _enqueue(engine: Engine, **fields: object) -> int:
    base: dict[str, object] = {
        "endpoint": "billing",
        "event_type": "e",
        "payload": {},
        "idempotency_key": "k",
    }
    base.update(fields)
    with Session(engine) as session, session.begin():
        return enqueue(session, **base)  # type: ignore[arg-type]


def test_ten_megabyte_payload_and_ten_thousand_char_key(
    engine: Engine, endpoint: CreatedEndpoint
) -> None:
    with pytest.raises(PayloadTooLarge, match="10485771 bytes as JSON; the limit is 262144"):
        _enqueue(engine, payload={"blob": "x" * (10 * 1024 * 1024)})
    with pytest.raises(InvalidIdempotencyKey, match="10000 characters"):
        _enqueue(engine, idempotency_key="k" * 10_000)
    with pytest.raises(UnknownEndpoint):
        _enqueue(engine, endpoint="billing'; DROP TABLE poller_outbox; --")


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1/hook",
        "http://[::1]/hook",
        "http://localhost:8080/",
        "http://169.254.169.254/latest",
    ],
)
def test_private_urls_refused_when_saved(url: str) -> None:
    with pytest.raises(InvalidEndpoint, match="private, loopback or link-local"):
        check_url(url, allow_private=False)


async def slow_drip(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await servers.read_request(reader)
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n")
    while True:
        writer.write(b"x")
        await writer.drain()
        await asyncio.sleep(0.2)


async def stalled_body(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await servers.read_request(reader)
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n")
    await writer.drain()
    await asyncio.sleep(3600)  # not a byte of the body


async def huge_headers(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await servers.read_request(reader)
    writer.write(b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * (1024 * 1024) + b"\r\n\r\n")
    await writer.drain()


@pytest.mark.parametrize("kind", senders.KINDS)
@pytest.mark.parametrize("answer", [slow_drip, stalled_body], ids=["slow-drip", "never-starts"])
async def test_a_slow_body_is_cut_by_the_timeout_and_the_status_counts(
    kind: str, answer: servers.Handler
) -> None:
    sender = senders.make(kind, allow_private=True)
    async with servers.raw_server(answer) as url:
        attempt = await send(sender, _endpoint(url), _message(), timeout=1.0, user_agent="t")
    await sender.aclose()
    assert attempt.verdict is Verdict.DELIVERED and attempt.status_code == 200
    assert 900 <= attempt.duration_ms < 3000


@pytest.mark.parametrize("kind", senders.KINDS)
async def test_a_megabyte_of_headers_is_an_unknown_outcome(kind: str) -> None:
    sender = senders.make(kind, allow_private=True)
    async with servers.raw_server(huge_headers) as url:
        attempt = await send(sender, _endpoint(url), _message(), timeout=2.0, user_agent="t")
    await sender.aclose()
    assert attempt.verdict is Verdict.UNKNOWN  # sent, and the answer was unreadable


@pytest.mark.parametrize("kind", senders.KINDS)
async def test_no_failure_of_any_sender_shows_a_urls_path_or_query(kind: str) -> None:
    """A Slack-style URL's path is its credential, a query often holds a token: a
    receiver that answers garbage, closes at once, or is not there, and each sender's
    error keeps neither (aiohttp's quoted the whole URL)."""
    secret = "/services/T0/B0/PATH-SECRET-42?token=QUERY-SECRET-43"
    sender = senders.make(kind, allow_private=True)
    try:
        errors = []
        for answer in (servers.bad_status_line, servers.close_after_request, huge_headers):
            async with servers.raw_server(answer) as url:
                attempt = await send(sender, _endpoint(url + secret), _message(), timeout=2.0,
                                     user_agent="t")  # fmt: skip
            errors.append(attempt.error_message or "")
        closed = servers.free_closed_port() + secret
        attempt = await send(sender, _endpoint(closed), _message(), timeout=2.0, user_agent="t")
        errors.append(attempt.error_message or "")
    finally:
        await sender.aclose()
    assert all(errors) and not [e for e in errors if "SECRET" in e], errors
