"""Trace context through the outbox: captured at enqueue, carried to the receiver.

A transactional outbox is where a trace is usually cut in two: the request that
committed the message ends, and the delivery starts a fresh trace later, in
another process. So when the application has an OpenTelemetry span current as
it enqueues or publishes, the insert stores that span's W3C ``traceparent`` and
``tracestate`` with the message (or the event, for fan-out) — same statement,
same transaction — and the delivery continues that trace
(poller/observe/otel.py makes the attempt spans its children; the receiver gets the
delivery's ``traceparent``).

**No cost without it.** :func:`capture` never imports OpenTelemetry: it looks
for ``opentelemetry.trace`` among the modules the application already imported,
and stores nothing when there is none, or no valid span is current.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass

# version 00: 32 hex trace id, 16 hex span id, 2 hex flags; all-zero ids are invalid.
_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
MAX_TRACESTATE = 512  # W3C: at most 32 entries; longer is dropped, never truncated


@dataclass(frozen=True, slots=True)
class TraceContext:
    traceparent: str
    tracestate: str | None = None


def capture() -> TraceContext | None:
    """The application's current span as W3C trace context; None when OpenTelemetry is
    not imported, or no valid span is current."""
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return None
    span = trace.get_current_span().get_span_context()
    if not span.is_valid:
        return None
    parent = f"00-{span.trace_id:032x}-{span.span_id:016x}-{int(span.trace_flags):02x}"
    state = span.trace_state.to_header() if span.trace_state else ""
    return TraceContext(parent, state if state and len(state) <= MAX_TRACESTATE else None)


def trace_params(stored: bool = True) -> dict[str, str | None]:
    """The insert statements' ``:traceparent`` and ``:tracestate``: the current context,
    or NULLs (``stored`` False: rows whose event holds it)."""
    context = capture() if stored else None
    if context is None:
        return {"traceparent": None, "tracestate": None}
    return {"traceparent": context.traceparent, "tracestate": context.tracestate}


_TRACESTATE = re.compile(r"[\x20-\x7e]{1,512}")  # W3C list-members: visible ASCII, ',' and ' '


def propagated(traceparent: str | None, tracestate: str | None) -> dict[str, str]:
    """The ``traceparent`` (and ``tracestate``) headers a delivery carries; nothing for a
    value that is not W3C trace context (a row written by hand, say), never a bad header."""
    if not valid_traceparent(traceparent):
        return {}
    assert traceparent is not None
    headers = {"traceparent": traceparent}
    if tracestate and _TRACESTATE.fullmatch(tracestate):
        headers["tracestate"] = tracestate
    return headers


_NO_TRACE, _NO_SPAN = "0" * 32, "0" * 16


def valid_traceparent(value: str | None) -> bool:
    """Whether ``value`` is a ``traceparent`` a receiver can continue (version 00)."""
    return (
        value is not None
        and _TRACEPARENT.fullmatch(value) is not None
        and value[3:35] != _NO_TRACE
        and value[36:52] != _NO_SPAN
    )
