"""The reference receiver: verifies, dedupes, answers lookups, injects faults.

Used by the demo, the tests and the load test, and a model for real receivers:

* ``POST /<anything>`` — a webhook. The signature is verified (when a
  ``whsec_`` secret or a ``whpk_`` public key is given: poller/rules/signing.py) with
  a 5-minute timestamp tolerance; the message is *applied* once per
  ``webhook-id`` (later copies are counted as duplicates and answered 200).
* ``GET /webhooks/<key>`` — the lookup contract: 200 if that key was applied,
  404 if not.
* ``GET /stats`` — received, applied (unique), duplicates, per-path counts,
  lookups, faults injected, commit→receipt latency percentiles from an
  ``enqueued_at`` (epoch seconds) field in the payload, when present, and
  ordered messages applied with ``order_violations``: one applied with a lower
  ``webhook-ordering-seq`` than an earlier one of its ``webhook-ordering-key``.
* ``GET /receipts`` — each applied key with the time (epoch seconds) it was
  applied, so a load generator can compute latency from its own commit times;
  ``GET /counts`` — how many times each key arrived.

With ``required`` headers (``--require-header``), a POST without them is answered
401, like an API gateway that wants a bearer token.

Faults, each drawn per request: ``fail_rate`` answers ``status`` (default 500,
with ``Retry-After`` if set) without applying; ``drop_after_process_rate``
applies the message and then closes the connection without answering (the
sender cannot know: an *unknown* outcome); ``latency`` delays every answer.

It is a bare asyncio HTTP/1.1 server on httptools (and uvloop when present),
not an ASGI app: closing a connection without a response is one call here, and
it serves well over 10,000 requests/s on one core.
"""

from __future__ import annotations

import asyncio
import bisect
import json
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import unquote

import httptools

from poller.rules.signing import Verifier


@dataclass
class Faults:
    fail_rate: float = 0.0
    status: int = 500
    retry_after: str | None = None
    latency: float = 0.0
    drop_after_process_rate: float = 0.0
    # Testing the testers: answer 200 to the first N messages but never apply them
    # (a receiver that loses data), so a load test can prove it detects loss.
    ack_and_discard: int = 0
    # Chaos: answer 410 Gone once this many messages were applied (an endpoint going away).
    gone_after: int | None = None
    # Chaos: this share of requests waits ``spike`` seconds first (beyond a sender's timeout).
    spike_rate: float = 0.0
    spike: float = 0.0
    rng: random.Random = field(default_factory=random.Random)


@dataclass
class Stats:
    received: int = 0
    applied: int = 0
    duplicates: int = 0
    bad_signatures: int = 0
    unauthorized: int = 0  # POSTs without a required header (``required``)
    failed_injected: int = 0
    dropped_injected: int = 0
    lookups_found: int = 0
    lookups_missing: int = 0
    ordered: int = 0  # applied messages that carried an ordering key
    order_violations: int = 0  # applied with a lower position than one applied before
    per_path: Counter[str] = field(default_factory=Counter)
    latencies_ms: list[float] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        lat = self.latencies_ms
        return {
            "received": self.received,
            "applied": self.applied,
            "unique": self.applied,
            "duplicates": self.duplicates,
            "bad_signatures": self.bad_signatures,
            "unauthorized": self.unauthorized,
            "failed_injected": self.failed_injected,
            "dropped_injected": self.dropped_injected,
            "lookups_found": self.lookups_found,
            "lookups_missing": self.lookups_missing,
            "ordered": self.ordered,
            "order_violations": self.order_violations,
            "per_path": dict(self.per_path),
            "latency_ms": {
                "count": len(lat),
                "p50": _pct(lat, 0.5),
                "p95": _pct(lat, 0.95),
                "p99": _pct(lat, 0.99),
                "max": lat[-1] if lat else None,
            },
        }


def _pct(ordered: list[float], q: float) -> float | None:
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def verify(verifier: Verifier, headers: dict[bytes, bytes], body: bytes, now: float) -> bool:
    """Standard Webhooks verification of a request (poller/rules/signing.py)."""
    return verifier.verify(
        headers.get(b"webhook-id", b""),
        headers.get(b"webhook-timestamp", b""),
        headers.get(b"webhook-signature", b""),
        body,
        now,
    )


class Receiver:
    """The receiver's state and request handling; :meth:`start` serves it."""

    def __init__(
        self,
        keys: list[str] | None = None,
        faults: Faults | None = None,
        required: dict[str, str] | None = None,
    ) -> None:
        self.verifier = Verifier(keys or [])  # whsec_ secrets and whpk_ public keys
        # Headers a POST must carry, as an API gateway wants a bearer token: else 401.
        self.required = {
            k.lower().encode("latin-1"): v.encode("latin-1") for k, v in (required or {}).items()
        }
        self.faults = faults or Faults()
        self.stats = Stats()
        self.applied: dict[str, int] = {}  # key -> times received
        self.first_seen: dict[str, float] = {}  # key -> epoch seconds it was applied
        self.order_last: dict[bytes, int] = {}  # ordering key -> highest position applied
        self.server: asyncio.Server | None = None
        self.transports: set[asyncio.Transport] = set()

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(lambda: _Connection(self), host, port)
        return int(self.server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            for transport in list(self.transports):
                transport.abort()
            await self.server.wait_closed()

    # -- handling -----------------------------------------------------------

    async def handle(
        self, method: bytes, path: str, headers: dict[bytes, bytes], body: bytes
    ) -> tuple[int, dict[str, str], bytes] | None:
        """The response, or None to close the connection without answering."""
        if method == b"GET":
            return self._get(path)
        if method != b"POST":
            return 405, {}, b"method not allowed"
        self.stats.received += 1
        self.stats.per_path[path] += 1
        if self.faults.latency:
            await asyncio.sleep(self.faults.latency)
        if self.faults.spike_rate and self.faults.rng.random() < self.faults.spike_rate:
            await asyncio.sleep(self.faults.spike)
        if self.faults.gone_after is not None and self.stats.applied >= self.faults.gone_after:
            return 410, {}, b"gone"
        now = time.time()
        if self.verifier and not verify(self.verifier, headers, body, now):
            self.stats.bad_signatures += 1
            return 401, {}, b"bad signature"
        if any(headers.get(name) != value for name, value in self.required.items()):
            self.stats.unauthorized += 1
            return 401, {}, b"missing credential"
        key = headers.get(b"webhook-id", b"").decode("latin-1")
        rng = self.faults.rng
        if self.faults.fail_rate and rng.random() < self.faults.fail_rate:
            self.stats.failed_injected += 1
            extra = {"Retry-After": self.faults.retry_after} if self.faults.retry_after else {}
            return self.faults.status, extra, b"injected failure"
        if self.faults.ack_and_discard > 0:  # acknowledged, never applied: a lost message
            self.faults.ack_and_discard -= 1
            return 200, {}, b"ok"
        self._apply(key, body, now, headers)
        if (
            self.faults.drop_after_process_rate
            and rng.random() < self.faults.drop_after_process_rate
        ):
            self.stats.dropped_injected += 1
            return None
        return 200, {}, b"ok"

    def _apply(
        self, key: str, body: bytes, now: float, headers: dict[bytes, bytes] | None = None
    ) -> None:
        seen = self.applied.get(key, 0)
        self.applied[key] = seen + 1
        if seen:
            self.stats.duplicates += 1
            return
        self.stats.applied += 1
        self.first_seen[key] = now
        if headers and b"webhook-ordering-key" in headers:
            self._check_order(headers)
        if b'"enqueued_at"' in body:
            try:
                enqueued_at = float(json.loads(body)["enqueued_at"])
            except (ValueError, KeyError, TypeError):
                return
            bisect.insort(self.stats.latencies_ms, (now - enqueued_at) * 1000)

    def _check_order(self, headers: dict[bytes, bytes]) -> None:
        """A message of an ordering key is applied after every lower position it will get:
        one with a lower position than one applied before is a violation."""
        ordering_key = headers[b"webhook-ordering-key"]
        try:
            seq = int(headers.get(b"webhook-ordering-seq", b""))
        except ValueError:
            self.stats.order_violations += 1
            return
        self.stats.ordered += 1
        if seq < self.order_last.get(ordering_key, 0):
            self.stats.order_violations += 1
        else:
            self.order_last[ordering_key] = seq

    def _get(self, path: str) -> tuple[int, dict[str, str], bytes]:
        if path == "/stats":
            body = json.dumps(self.stats.as_dict()).encode()
            return 200, {"Content-Type": "application/json"}, body
        if path.startswith("/webhooks/"):
            key = unquote(path.removeprefix("/webhooks/"))
            if key in self.applied:
                self.stats.lookups_found += 1
                return 200, {}, b"processed"
            self.stats.lookups_missing += 1
            return 404, {}, b"not processed"
        if path == "/receipts":  # key -> when it was applied, for exact latency figures
            return 200, {"Content-Type": "application/json"}, json.dumps(self.first_seen).encode()
        if path == "/counts":  # key -> how many times it arrived (wire duplicates)
            return 200, {"Content-Type": "application/json"}, json.dumps(self.applied).encode()
        if path == "/healthz":
            return 200, {}, b"ok"
        return 404, {}, b"not found"


_REASONS = {
    200: "OK",
    401: "Unauthorized",
    404: "Not Found",
    405: "Method Not Allowed",
    410: "Gone",
    429: "Too Many Requests",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


class _Connection(asyncio.Protocol):
    """One keep-alive connection: parse with httptools, answer in order."""

    def __init__(self, receiver: Receiver) -> None:
        self.receiver = receiver
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.headers: dict[bytes, bytes] = {}
        self.body = bytearray()
        self.url = b""
        self.previous: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.receiver.transports.add(self.transport)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self._write(400, {}, b"bad request", keep_alive=False)

    # httptools callbacks
    def on_message_begin(self) -> None:
        self.headers, self.body, self.url = {}, bytearray(), b""

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.lower()] = value

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        method = self.parser.get_method()
        path = httptools.parse_url(self.url).path.decode("latin-1")
        keep_alive = self.parser.should_keep_alive()
        previous = self.previous
        self.previous = asyncio.ensure_future(
            self._respond(previous, method, path, self.headers, bytes(self.body), keep_alive)
        )

    async def _respond(
        self,
        previous: asyncio.Future[None] | None,
        method: bytes,
        path: str,
        headers: dict[bytes, bytes],
        body: bytes,
        keep_alive: bool,
    ) -> None:
        if previous is not None:
            await previous  # answers leave in request order
        answer = await self.receiver.handle(method, path, headers, body)
        if answer is None:
            if self.transport is not None:
                self.transport.abort()
            return
        self._write(*answer, keep_alive=keep_alive)

    def _write(self, status: int, extra: dict[str, str], body: bytes, *, keep_alive: bool) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        head = [
            f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}",
            f"Content-Length: {len(body)}",
        ]
        head += [f"{k}: {v}" for k, v in extra.items()]
        if not keep_alive:
            head.append("Connection: close")
        self.transport.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
        if not keep_alive:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.transport is not None:
            self.receiver.transports.discard(self.transport)
        self.transport = None


async def serve(
    receiver: Receiver,
    host: str,
    port: int,
    ready: asyncio.Event | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    """Serve until ``stop`` is set (forever without one)."""
    bound = await receiver.start(host, port)
    print(f"receiver listening on http://{host}:{bound}", flush=True)
    if ready is not None:
        ready.set()
    try:
        await (stop or asyncio.Event()).wait()
    finally:
        await receiver.stop()
