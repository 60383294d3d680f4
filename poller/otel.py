"""The poller's own spans, exported over OTLP: one per delivery attempt, in the application's
trace (the ``otel`` extra: ``pip install 'webhook-poller[otel]'``).

**On** when the OpenTelemetry SDK is installed and the standard variables ask for
an exporter — ``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``
(over ``http/protobuf``, the default protocol; another one is refused with a warning,
and nothing is exported) — and
``OTEL_SDK_DISABLED`` is not ``true``; ``OTEL_SERVICE_NAME`` (default
``webhook-poller``), ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER`` and the
exporter's own variables are read by the SDK as usual. Unset: off, nothing imported.

**Batches** are spans too: each claim and each completion batch, ``claim batch`` /
``complete batch`` (``INTERNAL``, the start of a trace of their own), with a link to
each of its messages' traces (up to 128), as the messaging conventions advise for a
batch.

**The spans.** Each lookup and each send is a ``CLIENT`` span named ``send
{endpoint}`` or ``lookup {endpoint}``, after the messaging and HTTP-client
semantic conventions (``messaging.system``, ``messaging.operation.type`` ``send``,
``messaging.destination.name``, ``messaging.message.id``, ``http.request.method``,
``http.response.status_code``, ``server.address``, ``url.full`` without its query,
``error.type``; and ``webhook_poller.attempt`` / ``.outcome``). Never a payload, a
query string, a header's value or a secret. A span that delivers one message is a
**child** of the context the application enqueued it in (the messaging conventions
allow a span that processes a single message to be a child of its creation
context), so the request that committed the message and the receiver that got it
are one trace; the receiver gets this span as its parent (``traceparent``).

**Never in the way.** Finished spans go to a bounded queue that a thread exports in
batches; when the queue is full a span is dropped and counted
(``webhook_poller_spans_dropped_total``), so a collector that is down or slow never
blocks or slows a delivery. A graceful stop flushes what is queued, for a bounded
time.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from poller import metrics
from poller.tracing import valid_traceparent

log = logging.getLogger("poller.otel")
if TYPE_CHECKING:
    from poller.delivery import Attempt
    from poller.endpoints import Endpoint
    from poller.outcomes import ClaimedMessage

MAX_LINKS = 128  # a batch span's links to its messages' traces
QUEUE = 4096  # finished spans waiting for export; more are dropped, and counted
BATCH = 512
EXPORT_EVERY = 1.0  # seconds between exports when the queue is not full enough


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


class _Processor:
    """A span processor that never blocks: a bounded queue, a thread exporting batches."""

    def __init__(self, exporter: Any) -> None:
        self._exporter = exporter
        self._queue: deque[Any] = deque()
        self._wake = threading.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="otel-export", daemon=True)
        self._thread.start()

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        return None

    def on_end(self, span: Any) -> None:
        if not span.context.trace_flags.sampled:
            return
        if len(self._queue) >= QUEUE:
            metrics.SPANS_DROPPED.inc()
            return
        self._queue.append(span)
        if len(self._queue) >= BATCH:
            self._wake.set()

    def _export_some(self) -> None:
        batch: list[Any] = []
        while self._queue and len(batch) < BATCH:
            batch.append(self._queue.popleft())
        if batch:
            try:
                self._exporter.export(batch)
            except Exception:  # a collector's failure is the collector's: drop, go on
                metrics.SPANS_DROPPED.inc(len(batch))

    def _run(self) -> None:
        while not self._done.is_set():
            self._wake.wait(EXPORT_EVERY)
            self._wake.clear()
            while self._queue and not self._done.is_set():
                self._export_some()

    def shutdown(self) -> None:
        self.force_flush()
        self._done.set()
        self._wake.set()
        self._exporter.shutdown()

    def force_flush(self, timeout_millis: int = 5000) -> bool:
        deadline = time.monotonic() + timeout_millis / 1000
        while self._queue and time.monotonic() < deadline:
            self._export_some()
        return not self._queue


class Telemetry:
    """The poller's tracer, and what a delivery attempt's span needs."""

    def __init__(self, provider: Any, processor: _Processor) -> None:
        from opentelemetry.trace import (
            Link,
            SpanContext,
            SpanKind,
            Status,
            StatusCode,
            TraceFlags,
            set_span_in_context,
        )
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self._in_context = set_span_in_context
        self._link, self._context, self._flags = Link, SpanContext, TraceFlags
        self._internal = SpanKind.INTERNAL
        self._warned = False
        self._provider = provider
        self._processor = processor
        self._tracer = provider.get_tracer("webhook-poller")
        self._propagator = TraceContextTextMapPropagator()
        self._kind, self._status, self._code = SpanKind.CLIENT, Status, StatusCode

    def start(self, operation: str, endpoint: Endpoint, msg: ClaimedMessage) -> Any:
        """A started span for one lookup or send of ``msg``, a child of the context it was
        enqueued in (if any); None if tracing failed (a delivery never fails for it)."""
        try:
            return self._start(operation, endpoint, msg)
        except Exception:
            self._failed("starting a span")
            return None

    def _failed(self, what: str) -> None:
        metrics.SPANS_DROPPED.inc()
        if not self._warned:
            self._warned = True
            log.warning("tracing failed %s; deliveries go on without it", what, exc_info=True)

    def _start(self, operation: str, endpoint: Endpoint, msg: ClaimedMessage) -> Any:
        parent = None
        if msg.traceparent is not None:
            carrier = {"traceparent": msg.traceparent}
            if msg.tracestate:
                carrier["tracestate"] = msg.tracestate
            parent = self._propagator.extract(carrier)
        url = endpoint.lookup_url if operation == "lookup" else endpoint.url
        parts = urlsplit(url or "")
        attributes = {
            "messaging.system": "webhook-poller",
            "messaging.operation.type": "send",
            "messaging.operation.name": operation,
            "messaging.destination.name": endpoint.name,
            "messaging.message.id": str(msg.id),
            "webhook_poller.attempt": msg.attempts,
            "webhook_poller.event_type": msg.event_type,
            "http.request.method": "GET" if operation == "lookup" else "POST",
            "server.address": parts.hostname or "",
            # never the query string; a lookup's path holds the message's key
            "url.full": f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"
            + (parts.path if operation == "send" else ""),
        }
        return self._tracer.start_span(
            f"{operation} {endpoint.name}", context=parent, kind=self._kind, attributes=attributes
        )

    def headers(self, span: Any) -> dict[str, str] | None:
        """``traceparent`` (and ``tracestate``) naming ``span``, for the receiver; None if
        that failed."""
        try:
            carrier: dict[str, str] = {}
            self._propagator.inject(carrier, context=self._in_context(span))
            return carrier
        except Exception:
            self._failed("propagating a span")
            return None

    def finish(self, span: Any, attempt: Attempt, outcome: str, *, failed: bool) -> None:
        """Record what the exchange came to (``outcome``: the verdict of a send, the answer
        of a lookup) and end the span; ``failed`` marks it an error."""
        if span is None:
            return
        try:
            self._finish(span, attempt, outcome, failed=failed)
        except Exception:
            self._failed("ending a span")

    def _finish(self, span: Any, attempt: Attempt, outcome: str, *, failed: bool) -> None:
        span.set_attribute("webhook_poller.outcome", outcome)
        if attempt.status_code is not None:
            span.set_attribute("http.response.status_code", attempt.status_code)
        if failed:
            span.set_attribute(
                "error.type", attempt.error_class or str(attempt.status_code or "unknown")
            )
            span.set_status(self._status(self._code.ERROR))
        span.end()

    def batch(self, operation: str, started_ns: int, traceparents: list[str]) -> None:
        """A span for one claim or completion batch, linked to the messages' contexts (the
        ones enqueued inside a span; at most :data:`MAX_LINKS`)."""
        try:
            links = []
            for parent in traceparents[:MAX_LINKS]:
                if valid_traceparent(parent):
                    context = self._context(
                        int(parent[3:35], 16), int(parent[36:52], 16), True,
                        self._flags(int(parent[53:55], 16)),
                    )  # fmt: skip
                    links.append(self._link(context))
            span = self._tracer.start_span(
                f"{operation} batch",
                kind=self._internal,
                links=links,
                start_time=started_ns,
                attributes={
                    "messaging.system": "webhook-poller",
                    "messaging.operation.type": "receive" if operation == "claim" else "settle",
                    "messaging.operation.name": operation,
                    "messaging.batch.message_count": len(traceparents),
                },
            )
            span.end()
        except Exception:
            self._failed(f"recording a {operation} batch")

    def shutdown(self) -> None:
        """Flush what is queued (bounded) and stop exporting."""
        self._provider.shutdown()


def setup() -> Telemetry | None:
    """The poller's telemetry when the environment asks for it and the SDK is installed;
    None otherwise (nothing of OpenTelemetry imported)."""
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
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
    except ImportError:
        logging.getLogger("poller").warning(
            "OTEL_EXPORTER_OTLP_ENDPOINT is set but the OpenTelemetry SDK is not installed: "
            "install webhook-poller[otel] to export traces"
        )
        return None
    resource = Resource.create(
        {"service.name": os.environ.get("OTEL_SERVICE_NAME") or "webhook-poller"}
    )
    from opentelemetry.sdk.trace import SpanProcessor

    class Processor(_Processor, SpanProcessor):  # the SDK's base, imported only when on
        pass

    provider = TracerProvider(resource=resource)  # the sampler from OTEL_TRACES_SAMPLER
    processor = Processor(OTLPSpanExporter())
    provider.add_span_processor(processor)
    return Telemetry(provider, processor)
