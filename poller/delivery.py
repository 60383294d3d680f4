"""One delivery attempt over HTTP: sign, send, classify (SPEC §4), and result lookup.

Requests follow Standard Webhooks: ``webhook-id`` (the idempotency key, the
same on every attempt), ``webhook-timestamp`` and ``webhook-signature``
(``v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">``, one per active
secret during rotation), plus ``Idempotency-Key``, ``Content-Type`` and
``User-Agent``. Redirects are never followed.

Outcome table:

====================================================  ==========================
answer                                                verdict
====================================================  ==========================
2xx                                                   delivered
410                                                   gone: failed, endpoint off
a status in ``permanent_statuses``                    failed
429, 503 (honouring ``Retry-After``), other statuses  retry
not sent (DNS, refused, TLS, connect/pool timeout)    retry (known not delivered)
sent, no answer (read timeout, reset, bad response)   unknown: retry + lookup
====================================================  ==========================

The response body is read up to :data:`READ_CAP` and then the connection is
dropped, so a receiver streaming gigabytes costs nothing; the first
:data:`EXCERPT_CAP` characters are kept, decoded leniently (invalid UTF-8 and
NUL bytes stored safely).
"""

from __future__ import annotations

import asyncio
import base64
import enum
import hashlib
import hmac
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import httpx

from poller import claims
from poller.claims import ClaimedMessage, Outcome
from poller.endpoints import LOOKUP_PLACEHOLDER, SECRET_PREFIX, Endpoint
from poller.retry import parse_retry_after, retry_delay
from poller.settings import Settings

READ_CAP = 64 * 1024
EXCERPT_CAP = 2048
# Not sent: the receiver cannot have seen the request.
NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.UnsupportedProtocol)


class Verdict(enum.StrEnum):
    DELIVERED = "delivered"
    RETRY = "retry"
    UNKNOWN = "unknown"
    FAILED = "failed"
    GONE = "gone"


class LookupAnswer(enum.StrEnum):
    FOUND = "found"  # processed: delivered without a re-send
    NOT_FOUND = "not_found"  # not processed: send now
    ERROR = "error"  # neither: ask again later


@dataclass(frozen=True, slots=True)
class Attempt:
    """What one HTTP exchange (send or lookup) came to."""

    verdict: Verdict
    started_at: datetime
    duration_ms: float
    status_code: int | None = None
    error_class: str | None = None
    error_message: str | None = None
    retry_after: float | None = None
    response_excerpt: str | None = None

    def detail(self) -> dict[str, Any]:
        return {
            "status_code": self.status_code,
            "error_class": self.error_class,
            "error_message": self.error_message,
            "started_at": self.started_at,
            "duration_ms": self.duration_ms,
            "response_excerpt": self.response_excerpt,
        }


def signing_secrets(endpoint: Endpoint, now: datetime) -> list[str]:
    """The current secret, plus the previous one until it expires (rotation)."""
    active = [endpoint.secret]
    expires = endpoint.previous_secret_expires_at
    if endpoint.previous_secret and (expires is None or expires > now):
        active.append(endpoint.previous_secret)
    return active


def sign(secrets: Sequence[str], msg_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` header value: ``v1,<sig>`` per secret, space-separated."""
    signed = f"{msg_id}.{timestamp}.".encode() + body
    signatures = []
    for secret in secrets:
        key = base64.b64decode(secret.removeprefix(SECRET_PREFIX))
        digest = hmac.new(key, signed, hashlib.sha256).digest()
        signatures.append("v1," + base64.b64encode(digest).decode("ascii"))
    return " ".join(signatures)


def webhook_headers(
    endpoint: Endpoint, idempotency_key: str, body: bytes, user_agent: str
) -> dict[str, str]:
    now = datetime.now(UTC)
    timestamp = int(now.timestamp())
    return {
        "webhook-id": idempotency_key,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign(signing_secrets(endpoint, now), idempotency_key, timestamp, body),
        "Idempotency-Key": idempotency_key,
        "Content-Type": "application/json",
        "User-Agent": user_agent,
    }


def classify_status(status: int, permanent: Sequence[int] = ()) -> Verdict:
    if 200 <= status < 300:
        return Verdict.DELIVERED
    if status == 410:
        return Verdict.GONE
    if status in permanent:
        return Verdict.FAILED
    return Verdict.RETRY


def classify_error(exc: BaseException) -> Verdict:
    """Not sent → RETRY (known not delivered); anything after sending → UNKNOWN."""
    return Verdict.RETRY if isinstance(exc, NOT_SENT) else Verdict.UNKNOWN


def _excerpt(data: bytes) -> str:
    text = data[:EXCERPT_CAP].decode("utf-8", errors="replace").replace("\x00", "\ufffd")
    return text[:EXCERPT_CAP]


async def _read_capped(response: httpx.Response) -> bytes:
    """Up to READ_CAP bytes of the body; errors while reading keep what was read."""
    data = bytearray()
    try:
        async for chunk in response.aiter_raw():
            data += chunk
            if len(data) >= READ_CAP:
                break
    except (httpx.HTTPError, TimeoutError):
        pass
    return bytes(data)


async def exchange(
    client: httpx.AsyncClient, request: httpx.Request, timeout: float
) -> tuple[httpx.Response | None, BaseException | None, bytes, datetime, float]:
    """Send ``request``; the response (or the error) and up to READ_CAP body bytes.

    The whole exchange is bounded by ``timeout`` (a slow-drip body cannot hold
    a claim past its lease); a status already received still counts.
    """
    started_at = datetime.now(UTC)
    began = time.perf_counter()
    response: httpx.Response | None = None
    error: BaseException | None = None
    body = b""
    try:
        async with asyncio.timeout(timeout):
            response = await client.send(request, stream=True, follow_redirects=False)
            try:
                body = await _read_capped(response)
            finally:
                await response.aclose()
    except TimeoutError as exc:
        if response is None:
            error = httpx.ReadTimeout(f"no answer within {timeout:g}s", request=request)
            error.__cause__ = exc
    except httpx.HTTPError as exc:
        error = exc
    return response, error, body, started_at, (time.perf_counter() - began) * 1000


async def send(
    client: httpx.AsyncClient,
    endpoint: Endpoint,
    msg: ClaimedMessage,
    *,
    timeout: float,
    user_agent: str,
    permanent_statuses: Sequence[int] = (),
) -> Attempt:
    """POST the message to the endpoint once and classify the result."""
    body = msg.payload.encode("utf-8")
    request = client.build_request(
        "POST",
        endpoint.url,
        content=body,
        headers=webhook_headers(endpoint, msg.idempotency_key, body, user_agent),
        timeout=httpx.Timeout(timeout),
    )
    response, error, data, started_at, duration_ms = await exchange(client, request, timeout)
    if response is None:
        assert error is not None
        return Attempt(
            classify_error(error),
            started_at,
            duration_ms,
            error_class=type(error).__name__,
            error_message=str(error)[:500],
        )
    verdict = classify_status(response.status_code, permanent_statuses)
    retry_after = None
    if response.status_code in (429, 503):
        retry_after = parse_retry_after(response.headers.get("retry-after"))
    return Attempt(
        verdict,
        started_at,
        duration_ms,
        status_code=response.status_code,
        error_message=None if verdict is Verdict.DELIVERED else f"HTTP {response.status_code}",
        retry_after=retry_after,
        response_excerpt=_excerpt(data),
    )


async def lookup(
    client: httpx.AsyncClient,
    endpoint: Endpoint,
    msg: ClaimedMessage,
    *,
    timeout: float,
    user_agent: str,
) -> tuple[LookupAnswer, Attempt]:
    """Ask the endpoint whether it processed the message (signed GET on its lookup_url)."""
    assert endpoint.lookup_url is not None
    url = endpoint.lookup_url.replace(LOOKUP_PLACEHOLDER, quote(msg.idempotency_key, safe=""))
    request = client.build_request(
        "GET",
        url,
        headers=webhook_headers(endpoint, msg.idempotency_key, b"", user_agent),
        timeout=httpx.Timeout(timeout),
    )
    response, error, data, started_at, duration_ms = await exchange(client, request, timeout)
    if response is None:
        assert error is not None
        return LookupAnswer.ERROR, Attempt(
            Verdict.UNKNOWN,
            started_at,
            duration_ms,
            error_class=type(error).__name__,
            error_message=str(error)[:500],
        )
    status = response.status_code
    answer = {200: LookupAnswer.FOUND, 404: LookupAnswer.NOT_FOUND}.get(status, LookupAnswer.ERROR)
    verdict = Verdict.DELIVERED if answer is LookupAnswer.FOUND else Verdict.UNKNOWN
    return answer, Attempt(
        verdict,
        started_at,
        duration_ms,
        status_code=status,
        response_excerpt=_excerpt(data),
        error_message=None if status in (200, 404) else f"lookup HTTP {status}",
    )


def to_outcome(msg: ClaimedMessage, attempt: Attempt, settings: Settings) -> Outcome:
    """The row write for a send attempt, with the retry delay from the schedule."""
    detail = attempt.detail()
    if attempt.verdict is Verdict.DELIVERED:
        return claims.delivered(msg, **detail)
    if attempt.verdict in (Verdict.FAILED, Verdict.GONE):
        return claims.failed(msg, **detail)
    delay = retry_delay(
        settings.retry_schedule, msg.attempts, attempt.retry_after, settings.retry_after_max
    )
    if attempt.verdict is Verdict.UNKNOWN:
        return claims.unknown(msg, delay, **detail)
    return claims.retry(msg, delay, **detail)


def lookup_outcome(msg: ClaimedMessage, attempt: Attempt, settings: Settings) -> Outcome:
    """The row write when a lookup answered FOUND (delivered) or ERROR (ask again later)."""
    if attempt.verdict is Verdict.DELIVERED:
        return claims.delivered(msg, kind="lookup", **attempt.detail())
    delay = retry_delay(settings.retry_schedule, msg.attempts, None, settings.retry_after_max)
    return claims.lookup_pending(msg, delay, **attempt.detail())
