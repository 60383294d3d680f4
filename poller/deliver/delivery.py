"""One delivery attempt over HTTP: sign, send, classify, and result lookup.

Requests follow Standard Webhooks: ``webhook-id`` (the idempotency key, the
same on every attempt), ``webhook-timestamp`` and ``webhook-signature``
(``v1,`` HMAC-SHA256 or ``v1a,`` ed25519 of ``"{id}.{timestamp}.{body}"``,
one per active key during rotation: poller/rules/signing.py), plus
``Idempotency-Key``, ``Content-Type`` and ``User-Agent`` (a broker's message has
neither ``Idempotency-Key`` nor ``User-Agent``); ordered messages
add ``webhook-ordering-key`` and ``webhook-ordering-seq`` (poller/rows/ordering.py).
Redirects are never followed.

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

A TLS failure includes a client certificate the receiver refused (poller/endpoints/tls.py).
Every sender (poller/deliver/wire.py) reads the body only up to its cap and drops
the connection, so a receiver streaming gigabytes costs nothing; the first
:data:`EXCERPT_CAP` characters are kept, decoded leniently (invalid UTF-8 and
NUL bytes stored safely).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from urllib.parse import quote

from poller.deliver.wire import RETRY_AFTER_STATUSES, Reply, Sender
from poller.endpoints.registry import Endpoint
from poller.endpoints.urls import LOOKUP_PLACEHOLDER
from poller.errors import SendError
from poller.rules import outcomes
from poller.rules.destinations import is_broker
from poller.rules.outcomes import Attempt, ClaimedMessage, LookupAnswer, Outcome, Verdict
from poller.rules.retry import parse_retry_after, retry_delay
from poller.rules.signing import sign
from poller.settings import Settings

EXCERPT_CAP = 2048


ORDERING_KEY_HEADER = "webhook-ordering-key"
ORDERING_SEQ_HEADER = "webhook-ordering-seq"


def webhook_headers(
    endpoint: Endpoint,
    idempotency_key: str,
    body: bytes,
    user_agent: str,
    now: datetime | None = None,
    *,
    http: bool = True,
) -> dict[str, str]:
    """The headers of a request, signed at ``now`` (default: the clock's). A broker's
    message (``http=False``) has no ``Idempotency-Key`` and ``User-Agent``: HTTP's own
    headers, the first a third copy of ``webhook-id`` beside the broker's message id."""
    now = now or datetime.now(UTC)
    timestamp = int(now.timestamp())
    headers = {
        **dict(endpoint.headers),  # the endpoint's own (poller/endpoints/headers.py): never ours
        "webhook-id": idempotency_key,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign(endpoint.signing_secrets(now), idempotency_key, timestamp, body),
        "Content-Type": "application/json",
    }
    if http:
        headers["Idempotency-Key"] = idempotency_key
        headers["User-Agent"] = user_agent
    return headers


def classify_status(status: int, permanent: Sequence[int] = ()) -> Verdict:
    if 200 <= status < 300:
        return Verdict.DELIVERED
    if status == 410:
        return Verdict.GONE
    if status in permanent:
        return Verdict.FAILED
    return Verdict.RETRY


def _excerpt(data: bytes) -> str:
    text = data[:EXCERPT_CAP].decode("utf-8", errors="replace").replace("\x00", "\ufffd")
    return text[:EXCERPT_CAP]


async def _exchange(
    sender: Sender,
    method: str,
    endpoint: Endpoint,
    url: str,
    headers: Mapping[str, str],
    body: bytes,
    timeout: float,
) -> tuple[Reply | SendError, float]:
    """The sender's answer (or why there was none), and how long it took in ms."""
    began = time.perf_counter()
    try:  # with the endpoint's client certificate and CA (poller/endpoints/tls.py)
        result: Reply | SendError = await sender.request(
            method, url, headers, body, timeout, endpoint.tls
        )
    except SendError as exc:
        result = exc
    return result, (time.perf_counter() - began) * 1000


def _failed_exchange(error: SendError, started_at: datetime, duration_ms: float) -> Attempt:
    verdict = Verdict.UNKNOWN if error.sent else Verdict.RETRY
    return Attempt(
        verdict, started_at, duration_ms, error_class=error.error_class, error_message=str(error)
    )


async def send(
    sender: Sender,
    endpoint: Endpoint,
    msg: ClaimedMessage,
    *,
    timeout: float,
    user_agent: str,
    permanent_statuses: Sequence[int] = (),
    trace: Mapping[str, str] | None = None,
) -> Attempt:
    """POST the message to the endpoint once and classify the result; ``trace``: the
    ``traceparent`` headers to send (poller/rules/tracing.py)."""
    body = msg.payload.encode("utf-8")
    started_at = datetime.now(UTC)  # the attempt's start, and the signature's time
    headers = webhook_headers(
        endpoint,
        msg.idempotency_key,
        body,
        user_agent,
        started_at,
        http=not is_broker(endpoint.url),
    )
    if trace:
        headers.update(trace)
    if msg.ordering_key is not None:  # poller/rows/ordering.py: a receiver can check the order
        headers[ORDERING_KEY_HEADER] = msg.ordering_key
        headers[ORDERING_SEQ_HEADER] = str(msg.position or msg.id)
    reply, duration_ms = await _exchange(
        sender, "POST", endpoint, endpoint.target, headers, body, timeout
    )
    if isinstance(reply, SendError):
        return _failed_exchange(reply, started_at, duration_ms)
    verdict = classify_status(reply.status, permanent_statuses)
    retry_after = (
        parse_retry_after(reply.retry_after) if reply.status in RETRY_AFTER_STATUSES else None
    )
    return Attempt(
        verdict,
        started_at,
        duration_ms,
        status_code=reply.status,
        error_message=None if verdict is Verdict.DELIVERED else f"HTTP {reply.status}",
        retry_after=retry_after,
        response_excerpt=_excerpt(reply.body),
    )


async def lookup(
    sender: Sender,
    endpoint: Endpoint,
    msg: ClaimedMessage,
    *,
    timeout: float,
    user_agent: str,
    trace: Mapping[str, str] | None = None,
) -> tuple[LookupAnswer, Attempt]:
    """Ask the endpoint whether it processed the message (signed GET on its lookup_url)."""
    assert endpoint.lookup_url is not None
    url = endpoint.lookup_url.replace(LOOKUP_PLACEHOLDER, quote(msg.idempotency_key, safe=""))
    started_at = datetime.now(UTC)
    headers = webhook_headers(endpoint, msg.idempotency_key, b"", user_agent, started_at)
    headers.pop("Content-Type")
    if trace:
        headers.update(trace)
    reply, duration_ms = await _exchange(sender, "GET", endpoint, url, headers, b"", timeout)
    if isinstance(reply, SendError):
        return LookupAnswer.ERROR, _failed_exchange(reply, started_at, duration_ms)
    status = reply.status
    answer = {200: LookupAnswer.FOUND, 404: LookupAnswer.NOT_FOUND}.get(status, LookupAnswer.ERROR)
    verdict = Verdict.DELIVERED if answer is LookupAnswer.FOUND else Verdict.UNKNOWN
    error = None if status in (200, 404) else f"lookup HTTP {status}"
    return answer, Attempt(
        verdict,
        started_at,
        duration_ms,
        status_code=status,
        response_excerpt=_excerpt(reply.body),
        error_message=error,
    )


def schedule_of(endpoint: Endpoint, settings: Settings) -> tuple[float, ...]:
    """The endpoint's retry schedule, else POLLER_RETRY_SCHEDULE."""
    return endpoint.retry_schedule or settings.retry_schedule


def to_outcome(
    msg: ClaimedMessage,
    attempt: Attempt,
    settings: Settings,
    schedule: tuple[float, ...] | None = None,
) -> Outcome:
    """The row write for a send attempt, with the retry delay from ``schedule`` (the
    endpoint's, :func:`schedule_of`; default POLLER_RETRY_SCHEDULE)."""
    detail = attempt.detail()
    if attempt.verdict is Verdict.DELIVERED:
        return outcomes.delivered(msg, **detail)
    if attempt.verdict in (Verdict.FAILED, Verdict.GONE):
        return outcomes.failed(msg, **detail)
    delay = retry_delay(
        schedule or settings.retry_schedule,
        msg.attempts,
        attempt.retry_after,
        settings.retry_after_max,
    )
    if attempt.verdict is Verdict.UNKNOWN:
        return outcomes.unknown(msg, delay, **detail)
    return outcomes.retry(msg, delay, **detail)


def lookup_outcome(
    msg: ClaimedMessage,
    attempt: Attempt,
    settings: Settings,
    schedule: tuple[float, ...] | None = None,
) -> Outcome:
    """The row write when a lookup answered FOUND (delivered) or ERROR (ask again later)."""
    if attempt.verdict is Verdict.DELIVERED:
        return outcomes.delivered(msg, kind="lookup", **attempt.detail())
    delay = retry_delay(
        schedule or settings.retry_schedule, msg.attempts, None, settings.retry_after_max
    )
    return outcomes.lookup_pending(msg, delay, **attempt.detail())
