"""Spans to a collector over OTLP/HTTP (``http/protobuf``), from the poller's own event
loop, never in a delivery's way.

**Why not the SDK's exporter.** The OpenTelemetry SDK's OTLP exporter encodes the
SDK's span objects, and a span object and its encoding cost about 130 µs of CPU
(loadtest/span_cost.py), as much as a third of a delivery. The poller writes each
span's protobuf itself as the span ends (poller/observe/otel.py: the parts an endpoint or
an outcome decides are encoded once), so an export only frames the encoded spans
(:func:`request`) and posts them; the messages are ``opentelemetry-proto``'s.

**Configured as the SDK is**, by the standard variables: the endpoint
(``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` as given, else ``OTEL_EXPORTER_OTLP_ENDPOINT``
with ``/v1/traces``), ``…_HEADERS``, ``…_TIMEOUT`` (seconds, as the Python SDK reads
it; default 10), ``…_COMPRESSION`` (``gzip`` or ``none``), ``…_CERTIFICATE``,
``…_CLIENT_CERTIFICATE`` and ``…_CLIENT_KEY``, each ``TRACES_`` one first; and the
batch processor's ``OTEL_BSP_MAX_QUEUE_SIZE`` (default 4096, twice the SDK's: a
poller ends many spans a second), ``OTEL_BSP_SCHEDULE_DELAY`` (ms, default 1000) and
``OTEL_BSP_MAX_EXPORT_BATCH_SIZE`` (default 512).

**Bounded.** Ended spans wait in a queue of at most ``OTEL_BSP_MAX_QUEUE_SIZE``; a
span that finds it full is dropped and counted (``webhook_poller_spans_dropped_total``).
At most :data:`IN_FLIGHT` exports are under way at once. An export the collector
could not take for now (no connection, a timeout, 429, 502, 503, 504) is retried after
1, 2, 4 and 8 s, then dropped and counted; any other refusal is dropped at once. A
collector that is down or never answers so costs the deliveries nothing but the
spans: the poller logs it at most once a minute, the endpoint without its query or
credentials, never a header.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import logging
import os
import ssl
import time
from collections import deque
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import aiohttp

from poller.observe import metrics

log = logging.getLogger("poller.observe.otel")

IN_FLIGHT = 4  # exports under way at once
RETRIES = (
    1.0,
    2.0,
    4.0,
    8.0,
)  # seconds before each retry of an export the collector could not take
TRANSIENT = frozenset({429, 502, 503, 504})
COMPLAIN_EVERY = 60.0  # seconds between two warnings of a failing collector


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(number: int, data: bytes) -> bytes:
    """``data`` as a length-delimited protobuf field."""
    return _varint(number << 3 | 2) + _varint(len(data)) + data


# A Span's fields (opentelemetry/proto/trace/v1/trace.proto) as their tags: field number
# << 3 | wire type (2: length-delimited, 1: fixed64, 5: fixed32).
TRACE_ID, SPAN_ID, TRACE_STATE, PARENT_SPAN_ID = b"\x0a", b"\x12", b"\x1a", b"\x22"
START, END = b"\x39", b"\x41"  # start_time_unix_nano (7), end_time_unix_nano (8)
ATTRIBUTE = b"\x4a"  # attributes (9), each a KeyValue
FLAGS = b"\x85\x01"  # flags (16)


def span_start(trace_id: bytes, span_id: bytes, parent: bytes, trace_state: str, flags: int,
               start_ns: int) -> bytes:  # fmt: skip
    """A Span's ids, flags and start, encoded (``parent``, ``trace_state``: none if empty).

    The hot path of every traced attempt, so written out rather than built as a message:
    protobuf lets a message's fields come in any order, and an encoded message followed by
    another is the two merged (how :mod:`poller.observe.otel` adds the parts it keeps encoded)."""
    parts = [TRACE_ID, b"\x10", trace_id, SPAN_ID, b"\x08", span_id]
    if parent:
        parts += [PARENT_SPAN_ID, b"\x08", parent]
    if trace_state:
        state = trace_state.encode()
        parts += [TRACE_STATE, _varint(len(state)), state]
    parts += [FLAGS, flags.to_bytes(4, "little"), START, start_ns.to_bytes(8, "little")]
    return b"".join(parts)


def span_end(end_ns: int) -> bytes:
    return END + end_ns.to_bytes(8, "little")


class StringAttribute:
    """One attribute of a Span (a KeyValue whose value is a string), encoded: called with
    the value, it adds to it the framing it keeps for values of that length."""

    __slots__ = ("_framing", "_key")

    def __init__(self, key: str) -> None:
        self._key = key.encode()
        self._framing: dict[int, bytes] = {}

    def __call__(self, value: str) -> bytes:
        data = value.encode()
        framing = self._framing.get(len(data))
        if framing is None:
            whole = _field(9, _field(1, self._key) + _field(2, _field(1, data)))
            framing = whole[: len(whole) - len(data)]  # the value comes last
            if len(self._framing) < 64:
                self._framing[len(data)] = framing
        return framing + data


def request(resource: bytes, scope: bytes, spans: list[bytes]) -> bytes:
    """An ``ExportTraceServiceRequest`` holding ``spans`` (each an encoded ``Span``) of one
    ``resource`` and ``scope`` (each encoded: a ``Resource``, an ``InstrumentationScope``).

    Protobuf's repeated fields are their entries one after another, so framing the
    spans already encoded is the whole request."""
    scope_spans = _field(1, scope) + b"".join([_field(2, span) for span in spans])
    return _field(1, _field(1, resource) + _field(2, scope_spans))


def _env(name: str, default: str = "") -> str:
    """``OTEL_EXPORTER_OTLP_TRACES_{name}``, else ``OTEL_EXPORTER_OTLP_{name}``."""
    return (
        os.environ.get(f"OTEL_EXPORTER_OTLP_TRACES_{name}")
        or os.environ.get(f"OTEL_EXPORTER_OTLP_{name}")
        or default
    ).strip()


def _env_number(name: str, default: float, low: float, high: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        log.warning("%s=%r is not a number; using %g", name, raw[:40], default)
        return default
    return min(max(value, low), high)


def _headers() -> dict[str, str]:
    """``OTEL_EXPORTER_OTLP_(TRACES_)HEADERS``: ``key=value`` pairs, URL-encoded."""
    from opentelemetry.util.re import parse_env_headers

    return dict(parse_env_headers(_env("HEADERS"), liberal=True))


def _tls() -> ssl.SSLContext | None:
    """The collector's CA and our client certificate, if the variables name them."""
    ca, cert, key = _env("CERTIFICATE"), _env("CLIENT_CERTIFICATE"), _env("CLIENT_KEY")
    if not (ca or cert):
        return None
    try:
        context = ssl.create_default_context(cafile=ca or None)
    except (OSError, ValueError) as exc:
        raise ValueError(f"OTEL_EXPORTER_OTLP_CERTIFICATE: cannot load {ca}: {exc}") from None
    if cert:
        try:
            context.load_cert_chain(cert, key or None)
        except (OSError, ValueError) as exc:
            raise ValueError(
                f"OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE: cannot load {cert}: {exc}"
            ) from None
    return context


def shown(url: str) -> str:
    """``url`` as a log may show it: no credentials, no query."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}{parts.path}"


@dataclass
class Config:
    endpoint: str
    headers: dict[str, str]
    timeout: float
    gzip: bool
    tls: ssl.SSLContext | None
    queue: int
    batch: int
    delay: float  # seconds

    @classmethod
    def from_env(cls) -> Config:
        """The exporter the standard variables describe (module docstring). Raises
        ``ValueError`` for a value that cannot work (a certificate file that is not one,
        say)."""
        endpoint = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
        if not endpoint:
            base = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
            endpoint = f"{base.removesuffix('/')}/v1/traces"
        if urlsplit(endpoint).scheme not in ("http", "https"):
            raise ValueError(f"the OTLP endpoint {shown(endpoint)!r} is not an http(s) URL")
        compression = _env("COMPRESSION", "none").lower()
        if compression not in ("gzip", "none"):
            log.warning("OTEL_EXPORTER_OTLP_COMPRESSION=%s: not supported; not compressing",
                        compression[:40])  # fmt: skip
        timeout = _env("TIMEOUT", "10")
        try:
            seconds = min(max(float(timeout), 0.1), 300.0)
        except ValueError:
            log.warning("OTEL_EXPORTER_OTLP_TIMEOUT=%r is not a number of seconds; using 10",
                        timeout[:40])  # fmt: skip
            seconds = 10.0
        queue = int(_env_number("OTEL_BSP_MAX_QUEUE_SIZE", 4096, 1, 1_000_000))
        return cls(
            endpoint=endpoint,
            headers=_headers(),
            timeout=seconds,
            gzip=compression == "gzip",
            tls=_tls(),
            queue=queue,
            batch=int(min(_env_number("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512, 1, 100_000), queue)),
            delay=_env_number("OTEL_BSP_SCHEDULE_DELAY", 1000, 1, 600_000) / 1000,
        )


@dataclass
class Exporter:
    """The queue of ended spans, and the task that exports them (:meth:`run`)."""

    config: Config
    resource: bytes  # an encoded Resource
    scope: bytes  # an encoded InstrumentationScope
    user_agent: str = "webhook-poller"
    _queue: deque[bytes] = field(default_factory=deque)
    _due: asyncio.Event = field(default_factory=asyncio.Event)
    _exports: set[asyncio.Task[None]] = field(default_factory=set)
    _complained: float = -COMPLAIN_EVERY
    _session: aiohttp.ClientSession | None = None

    def add(self, span: bytes) -> None:
        """Queue an ended span (encoded); dropped and counted when the queue is full."""
        if len(self._queue) >= self.config.queue:
            metrics.SPANS_DROPPED.inc()
            return
        self._queue.append(span)
        if len(self._queue) >= self.config.batch:
            self._due.set()

    @property
    def full(self) -> bool:
        return len(self._queue) >= self.config.queue

    async def run(self) -> None:
        """Export the queue, a batch at a time, until cancelled."""
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.config.delay):
                    await self._due.wait()
            self._due.clear()
            while self._queue:
                while len(self._exports) >= IN_FLIGHT:
                    await asyncio.wait(self._exports, return_when=asyncio.FIRST_COMPLETED)
                spans = self._take()
                task = asyncio.create_task(self._export(spans, RETRIES))
                self._exports.add(task)
                task.add_done_callback(self._exports.discard)
                if len(self._queue) < self.config.batch:
                    break  # the rest at the next tick, or when a batch is full

    def _take(self) -> list[bytes]:
        spans: list[bytes] = []
        while self._queue and len(spans) < self.config.batch:
            spans.append(self._queue.popleft())
        return spans

    async def close(self, timeout: float) -> None:
        """Export what is queued (once, no retries) and what is under way, for at most
        ``timeout`` seconds; what is left then is dropped and counted."""
        try:
            async with asyncio.timeout(timeout):
                while self._queue:
                    task = asyncio.create_task(self._export(self._take(), ()))
                    self._exports.add(task)
                    task.add_done_callback(self._exports.discard)
                if self._exports:
                    await asyncio.wait(self._exports)
        except TimeoutError:
            metrics.SPANS_DROPPED.inc(len(self._queue))
            self._queue.clear()
            log.warning("spans not exported within %gs of stopping: dropped", timeout)
        finally:
            for task in self._exports:
                task.cancel()
            if self._session is not None:
                await self._session.close()

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            headers = {
                "Content-Type": "application/x-protobuf",
                "User-Agent": self.user_agent,
                **self.config.headers,
            }
            if self.config.gzip:
                headers["Content-Encoding"] = "gzip"
            self._session = aiohttp.ClientSession(
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=self.config.timeout),
                connector=aiohttp.TCPConnector(limit=IN_FLIGHT, ssl=self.config.tls or True),
            )
        return self._session

    async def _export(self, spans: list[bytes], retries: tuple[float, ...]) -> None:
        body = request(self.resource, self.scope, spans)
        if self.config.gzip:
            body = gzip.compress(body, compresslevel=1)
        for wait in (*retries, None):
            try:
                problem = await self._post(body)
            except asyncio.CancelledError:  # a stop that could wait no longer
                metrics.SPANS_DROPPED.inc(len(spans))
                raise
            if problem is None:
                metrics.SPANS_EXPORTED.inc(len(spans))
                return
            reason, transient = problem
            if not transient or wait is None:
                metrics.SPANS_DROPPED.inc(len(spans))
                self._complain(f"{reason}; {len(spans)} spans dropped")
                return
            self._complain(f"{reason}; retrying")
            await asyncio.sleep(wait)

    async def _post(self, body: bytes) -> tuple[str, bool] | None:
        """None when the collector took ``body``; else why not, and whether to retry."""
        try:
            async with self._client().post(self.config.endpoint, data=body) as answer:
                await answer.read()
                if answer.status < 300:
                    return None
                return f"the collector answered {answer.status}", answer.status in TRANSIENT
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            return type(exc).__name__, True
        except Exception as exc:  # a setting aiohttp refuses (never its text: a credential)
            return type(exc).__name__, False

    def _complain(self, what: str) -> None:
        now = time.monotonic()
        if now - self._complained >= COMPLAIN_EVERY:
            self._complained = now
            log.warning(
                "exporting spans to %s: %s (deliveries go on; at most one such warning a minute)",
                shown(self.config.endpoint),
                what,
            )
