"""The poller's own spans, exported over OTLP: one per delivery attempt, in the application's
trace (the ``otel`` extra: ``pip install 'webhook-poller[otel]'``).

**On** when the OpenTelemetry SDK and its protobuf messages are installed, the
standard variables ask for an exporter (``OTEL_EXPORTER_OTLP_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, over ``http/protobuf``, the default protocol;
another one is refused with a warning, and nothing is exported), and
``OTEL_SDK_DISABLED`` is not ``true``. ``OTEL_SERVICE_NAME`` (default
``webhook-poller``) and ``OTEL_RESOURCE_ATTRIBUTES`` make the resource, as the SDK's
``Resource.create`` reads them; the exporter's variables are poller/observe/otlp.py's.
Unset: off, nothing imported.

**Batches** are spans too: each claim and each completion batch, ``claim batch`` /
``complete batch`` (``INTERNAL``, the start of a trace of their own), with a link to
each of its messages' traces (up to 128), as the messaging conventions advise for a
batch.

**The spans.** Each lookup and each send is a ``CLIENT`` span named ``send
{endpoint}`` or ``lookup {endpoint}``, after the messaging and HTTP-client
semantic conventions (``messaging.system``, ``messaging.operation.type`` ``send``,
``messaging.destination.name``, ``messaging.message.id``, ``http.request.method``,
``http.response.status_code``, ``server.address``, ``url.full`` as scheme, host and
port only, ``error.type``; and ``webhook_poller.attempt`` / ``.outcome``). Never a
payload, a URL's path or query (a Slack-style URL's path is its credential), a
header's value or a secret. A span that delivers one message is a
**child** of the context the application enqueued it in (the messaging conventions
allow a span that processes a single message to be a child of its creation
context), so the request that committed the message and the receiver that got it
are one trace; the receiver gets this span as its parent (``traceparent``).

**Sampling** is ``OTEL_TRACES_SAMPLER`` (and ``OTEL_TRACES_SAMPLER_ARG``), one of
the standard samplers: ``parentbased_always_on`` (the default), ``always_on``,
``always_off``, ``traceidratio``, ``parentbased_always_off``,
``parentbased_traceidratio``; another name is warned of and the default used. A span
not sampled is not recorded, but its id still goes to the receiver, flagged not
sampled, as the SDK does.

**Cheap.** A span here is not the SDK's span object: its ids, times and attributes
are encoded as OTLP protobuf as it ends, the part its endpoint decides once per
endpoint and the part its outcome decides once per outcome: about 8 µs a span,
against about 130 for the SDK's span and encoder in the same process
(poller/observe/otlp.py says how it is exported). **Never in the way.** Ended spans wait in
a bounded queue; a span that would find it full is not even encoded, but dropped and
counted (``webhook_poller_spans_dropped_total``), so a collector that is down or slow
never blocks or slows a delivery. A graceful stop exports what is queued, for a
bounded time.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from poller.observe import metrics
from poller.observe.otlp import StringAttribute, span_end, span_start
from poller.redact import shown_url
from poller.rules.tracing import valid_traceparent

log = logging.getLogger("poller.observe.otel")
if TYPE_CHECKING:
    from collections.abc import Callable

    from poller.endpoints.registry import Endpoint
    from poller.observe.otlp import Exporter
    from poller.rules.outcomes import Attempt, ClaimedMessage

    Sampler = Callable[[int, bool | None], bool]  # (trace id, parent sampled or None) -> sample

MAX_LINKS = 128  # a batch span's links to its messages' traces
CACHED = 1024  # encoded parts (an endpoint's, an outcome's) kept; past that a cache restarts
HAS_REMOTE, REMOTE = 0x100, 0x200  # SpanFlags: whether the parent is remote is known, it is
LOW_64 = (1 << 64) - 1
MESSAGE_ID = StringAttribute("messaging.message.id")


def wanted() -> bool:
    """Whether the environment asks for exported traces."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return False
    return bool(
        os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


def sampler() -> Sampler:
    """``OTEL_TRACES_SAMPLER`` (module docstring), as the SDK decides: a trace-id ratio
    samples a trace when its low 64 bits are under the ratio's share of 2**64."""
    name = os.environ.get("OTEL_TRACES_SAMPLER", "").strip().lower() or "parentbased_always_on"
    known = ("always_on", "always_off", "traceidratio")
    root = name.removeprefix("parentbased_")
    if root not in known:
        log.warning("OTEL_TRACES_SAMPLER=%s is not one of the standard samplers; using "
                    "parentbased_always_on", name[:40])  # fmt: skip
        name, root = "parentbased_always_on", "always_on"
    bound = 1 << 64 if root == "always_on" else 0
    if root == "traceidratio":
        arg = os.environ.get("OTEL_TRACES_SAMPLER_ARG", "").strip()
        try:
            ratio = min(max(float(arg), 0.0), 1.0) if arg else 1.0
        except ValueError:
            log.warning("OTEL_TRACES_SAMPLER_ARG=%r is not a ratio; using 1.0", arg[:40])
            ratio = 1.0
        bound = round(ratio * (1 << 64))

    if name.startswith("parentbased_"):
        return lambda trace_id, parent: (trace_id & LOW_64) < bound if parent is None else parent
    return lambda trace_id, parent: (trace_id & LOW_64) < bound


class Span:
    """One attempt's span: what the receiver gets of it, and its encoding so far (None:
    not sampled, so not recorded)."""

    __slots__ = ("head", "span_id", "traceparent")

    def __init__(self, traceparent: str, span_id: str, head: bytes | None) -> None:
        self.traceparent = traceparent  # naming this span, for the receiver
        self.span_id = span_id  # hex, for the log
        self.head = head


class Telemetry:
    """The poller's spans: started, ended, encoded, and handed to the exporter."""

    def __init__(self, exporter: Exporter, sample: Sampler) -> None:
        from opentelemetry.proto.common.v1 import common_pb2
        from opentelemetry.proto.trace.v1 import trace_pb2

        self._exporter = exporter
        self._sample = sample
        self._span, self._status = trace_pb2.Span, trace_pb2.Status
        self._error = self._status(code=trace_pb2.Status.STATUS_CODE_ERROR)
        self._client, self._internal = (
            trace_pb2.Span.SPAN_KIND_CLIENT,
            trace_pb2.Span.SPAN_KIND_INTERNAL,
        )
        self._kv, self._any = common_pb2.KeyValue, common_pb2.AnyValue
        self._kinds: dict[tuple[str, str, str], bytes] = {}  # what each endpoint decides
        self._tails: dict[tuple[str, int | None, str | None], bytes] = {}  # each outcome
        self._attributes: dict[tuple[str, str | int], bytes] = {}
        self._warned = False
        self._task: asyncio.Task[None] | None = None

    # -- an attempt's span ----------------------------------------------------------------

    def start(self, operation: str, endpoint: Endpoint, msg: ClaimedMessage) -> Span | None:
        """A started span for one lookup or send of ``msg``, a child of the context it was
        enqueued in (if any); None if tracing failed (a delivery never fails for it)."""
        try:
            return self._start(operation, endpoint, msg)
        except Exception:
            self._failed("starting a span")
            return None

    def _start(self, operation: str, endpoint: Endpoint, msg: ClaimedMessage) -> Span:
        parent = msg.traceparent if valid_traceparent(msg.traceparent) else None
        if parent is not None:
            trace_id, parent_sampled = int(parent[3:35], 16), bool(int(parent[53:55], 16) & 1)
        else:
            trace_id, parent_sampled = random.getrandbits(128) or 1, None
        span_id = random.getrandbits(64) or 1
        sampled = self._sample(trace_id, parent_sampled)
        traceparent = f"00-{trace_id:032x}-{span_id:016x}-{'01' if sampled else '00'}"
        if not sampled:
            return Span(traceparent, traceparent[36:52], None)
        if self._exporter.full:  # it would be dropped: not even encoded
            metrics.SPANS_DROPPED.inc()
            return Span(traceparent, traceparent[36:52], None)
        head = b"".join((
            span_start(
                trace_id.to_bytes(16, "big"),
                span_id.to_bytes(8, "big"),
                bytes.fromhex(parent[36:52]) if parent is not None else b"",
                (msg.tracestate or "") if parent is not None else "",
                0x01 | HAS_REMOTE | (REMOTE if parent is not None else 0),
                time.time_ns(),
            ),
            MESSAGE_ID(str(msg.id)),
            self._attribute("webhook_poller.attempt", msg.attempts),
            self._attribute("webhook_poller.event_type", msg.event_type),
            self._kind(operation, endpoint),
        ))  # fmt: skip
        return Span(traceparent, traceparent[36:52], head)

    def _attribute(self, key: str, value: str | int) -> bytes:
        """An attribute whose value repeats (an attempt number, an event type), encoded
        once."""
        found = self._attributes.get((key, value))
        if found is None:
            if len(self._attributes) >= CACHED:
                self._attributes.clear()
            any_value = (
                self._any(int_value=value) if isinstance(value, int)
                else self._any(string_value=value)
            )  # fmt: skip
            found = self._span(attributes=[self._kv(key=key, value=any_value)]).SerializeToString()
            self._attributes[key, value] = found
        return found

    def _kind(self, operation: str, endpoint: Endpoint) -> bytes:
        """The encoded part of a span that only its endpoint and operation decide."""
        url = (endpoint.lookup_url if operation == "lookup" else endpoint.url) or ""
        key = (operation, endpoint.name, url)
        found = self._kinds.get(key)
        if found is None:
            if len(self._kinds) >= CACHED:
                self._kinds.clear()
            parts = urlsplit(url)
            attributes = {
                "messaging.system": "webhook-poller",
                "messaging.operation.type": "send",
                "messaging.operation.name": operation,
                "messaging.destination.name": endpoint.name,
                "http.request.method": "GET" if operation == "lookup" else "POST",
                "server.address": parts.hostname or "",
                # never the path or the query: a Slack-style URL's path is its
                # credential, a lookup's holds the message's key (poller/endpoints/urls.py)
                "url.full": shown_url(url),
            }
            found = self._kinds[key] = self._span(
                name=f"{operation} {endpoint.name}",
                kind=self._client,
                attributes=[
                    self._kv(key=k, value=self._any(string_value=v)) for k, v in attributes.items()
                ],
            ).SerializeToString()
        return found

    def finish(self, span: Span | None, attempt: Attempt, outcome: str, *, failed: bool) -> None:
        """Record what the exchange came to (``outcome``: the verdict of a send, the answer
        of a lookup) and end the span; ``failed`` marks it an error."""
        if span is None or span.head is None:
            return
        try:
            error = (
                (attempt.error_class or str(attempt.status_code or "unknown")) if failed else None
            )
            key = (outcome, attempt.status_code, error)
            tail = self._tails.get(key)
            if tail is None:
                tail = self._tail(outcome, attempt.status_code, error)
            self._exporter.add(span.head + tail + span_end(time.time_ns()))
        except Exception:
            self._failed("ending a span")

    def _tail(self, outcome: str, status_code: int | None, error: str | None) -> bytes:
        """The encoded part of a span that what its exchange came to decides, kept."""
        if len(self._tails) >= CACHED:
            self._tails.clear()
        tail = self._attribute("webhook_poller.outcome", outcome)
        if status_code is not None:
            tail += self._attribute("http.response.status_code", status_code)
        if error is not None:
            tail += self._attribute("error.type", error)
            tail += self._span(status=self._error).SerializeToString()
        self._tails[outcome, status_code, error] = tail
        return tail

    def end(self, span: Span | None) -> None:
        """End ``span`` without an answer (its delivery was cancelled, or crashed)."""
        if span is None or span.head is None:
            return
        try:
            self._exporter.add(span.head + span_end(time.time_ns()))
        except Exception:
            self._failed("ending a span")

    def _failed(self, what: str) -> None:
        metrics.SPANS_DROPPED.inc()
        if not self._warned:
            self._warned = True
            log.warning("tracing failed %s; deliveries go on without it", what, exc_info=True)

    # -- a batch's span -------------------------------------------------------------------

    def batch(self, operation: str, started_ns: int, traceparents: list[str]) -> None:
        """A span for one claim or completion batch, linked to the messages' contexts (the
        ones enqueued inside a span; at most :data:`MAX_LINKS`)."""
        try:
            trace_id = random.getrandbits(128) or 1
            if not self._sample(trace_id, None):
                return
            links = [
                self._span.Link(
                    trace_id=bytes.fromhex(parent[3:35]),
                    span_id=bytes.fromhex(parent[36:52]),
                    flags=int(parent[53:55], 16) | HAS_REMOTE | REMOTE,
                )
                for parent in traceparents[:MAX_LINKS]
                if valid_traceparent(parent)
            ]
            kv, value = self._kv, self._any
            span = self._span(
                trace_id=trace_id.to_bytes(16, "big"),
                span_id=(random.getrandbits(64) or 1).to_bytes(8, "big"),
                flags=0x01 | HAS_REMOTE,
                name=f"{operation} batch",
                kind=self._internal,
                start_time_unix_nano=started_ns,
                end_time_unix_nano=time.time_ns(),
                links=links,
                attributes=[
                    kv(key="messaging.system", value=value(string_value="webhook-poller")),
                    kv(key="messaging.operation.type", value=value(
                        string_value="receive" if operation == "claim" else "settle")),
                    kv(key="messaging.operation.name", value=value(string_value=operation)),
                    kv(key="messaging.batch.message_count",
                       value=value(int_value=len(traceparents))),
                ],
            )  # fmt: skip
            self._exporter.add(span.SerializeToString())
        except Exception:
            self._failed(f"recording a {operation} batch")

    # -- exporting --------------------------------------------------------------------

    def start_exporting(self) -> None:
        """Export from a task of the running loop, until :meth:`close`."""
        if self._task is None:
            self._task = asyncio.create_task(self._exporter.run(), name="otel-export")

    async def close(self, timeout: float) -> None:
        """Export what is queued (for at most ``timeout`` seconds) and stop exporting."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self._exporter.close(timeout)


def _value(value: Any) -> Any:
    """A resource attribute's value as an ``AnyValue``."""
    from opentelemetry.proto.common.v1 import common_pb2

    if isinstance(value, bool):
        return common_pb2.AnyValue(bool_value=value)
    if isinstance(value, int):
        return common_pb2.AnyValue(int_value=value)
    if isinstance(value, float):
        return common_pb2.AnyValue(double_value=value)
    if isinstance(value, list | tuple):
        return common_pb2.AnyValue(
            array_value=common_pb2.ArrayValue(values=[_value(v) for v in value])
        )
    return common_pb2.AnyValue(string_value=str(value))


def setup() -> Telemetry | None:
    """The poller's telemetry when the environment asks for it and the SDK is installed;
    None otherwise (nothing of OpenTelemetry imported). Call :meth:`Telemetry.start_exporting`
    from the running loop."""
    if not wanted():
        return None
    protocol = (
        os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    ).strip()
    if protocol != "http/protobuf":
        logging.getLogger("poller").warning(
            "OTEL_EXPORTER_OTLP_PROTOCOL=%s: only http/protobuf is supported; not exporting "
            "traces (point the pollers at the collector's OTLP/HTTP port, 4318)",
            protocol[:40],
        )
        return None
    try:
        from opentelemetry.proto.common.v1 import common_pb2
        from opentelemetry.proto.resource.v1 import resource_pb2
        from opentelemetry.sdk.resources import Resource
    except ImportError:
        logging.getLogger("poller").warning(
            "OTEL_EXPORTER_OTLP_ENDPOINT is set but the OpenTelemetry SDK is not installed: "
            "install webhook-poller[otel] to export traces"
        )
        return None
    from poller.observe.otlp import Config, Exporter
    from poller.rules.version import version

    try:
        config = Config.from_env()
    except ValueError as exc:
        logging.getLogger("poller").warning("not exporting traces: %s", exc)
        return None
    resource = Resource.create(
        {"service.name": os.environ.get("OTEL_SERVICE_NAME") or "webhook-poller"}
    )
    encoded = resource_pb2.Resource(
        attributes=[
            common_pb2.KeyValue(key=key, value=_value(value))
            for key, value in resource.attributes.items()
        ]
    ).SerializeToString()
    scope = common_pb2.InstrumentationScope(name="webhook-poller", version=version())
    exporter = Exporter(
        config, encoded, scope.SerializeToString(), user_agent=f"webhook-poller/{version()}"
    )
    return Telemetry(exporter, sampler())
