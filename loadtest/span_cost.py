"""What one attempt's span costs in one process: the poller's (poller/observe/otel.py: started,
ended, framed into an export request) against the OpenTelemetry SDK's span and OTLP
encoder for the same span (a benchmark: it prints figures; CPU µs a span, best of
``--repeat``). Why the poller writes its spans itself.

    python -m loadtest.span_cost --spans 20000
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from datetime import UTC, datetime
from typing import Any

from poller.deliver.delivery import Attempt, Verdict
from poller.endpoints.registry import Endpoint
from poller.rules.outcomes import ClaimedMessage

NOW = datetime(2026, 1, 1, tzinfo=UTC)
PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
BATCH = 512


def _cpu(work: Any, *args: Any) -> float:
    began = time.process_time()
    work(*args)
    return time.process_time() - began


def _ours(spans: int) -> tuple[float, float, float]:
    """µs a span: starting it, ending it, framing it into a request."""
    os.environ.setdefault("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    os.environ["OTEL_BSP_MAX_QUEUE_SIZE"] = str(spans)
    from poller.observe import otel, otlp

    async def run() -> tuple[float, float, float]:
        telemetry = otel.setup()
        assert telemetry is not None
        endpoint = Endpoint(
            id=1, name="bench", url="https://hooks.example/in", lookup_url=None, enabled=True,
            disabled_reason=None, max_attempts=None, timeout=None, max_in_flight=None,
            bucket=0, created_at=NOW, updated_at=NOW, secret="s",
        )  # fmt: skip
        messages = [
            ClaimedMessage(
                id=n, endpoint_id=1, bucket=0, event_type="order.paid", payload="{}",
                idempotency_key=f"k{n}", attempts=1, max_attempts=5, claim_token=1,
                claim_expires_at=NOW, needs_lookup=False, created_at=NOW,
                endpoint_updated_at=NOW, traceparent=PARENT,
            )
            for n in range(spans)
        ]  # fmt: skip
        attempt = Attempt(Verdict.DELIVERED, NOW, 1.0, status_code=200)
        started: list[Any] = []
        start = _cpu(lambda: started.extend(telemetry.start("send", endpoint, m) for m in messages))

        def end_all() -> None:
            for span in started:
                telemetry.finish(span, attempt, "delivered", failed=False)

        end = _cpu(end_all)
        exporter = telemetry._exporter
        queued = list(exporter._queue)
        frame = _cpu(lambda: [otlp.request(exporter.resource, exporter.scope, queued[k : k + BATCH])
                              for k in range(0, len(queued), BATCH)])  # fmt: skip
        exporter._queue.clear()  # nothing listens: nothing to export
        await telemetry.close(0.1)
        return start / spans * 1e6, end / spans * 1e6, frame / spans * 1e6

    return asyncio.run(run())


def _sdks(spans: int) -> tuple[float, float]:
    """µs a span: the SDK's span (started with the same attributes, ended), and its OTLP
    encoding."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
    from opentelemetry.trace import SpanKind
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    ended: list[Any] = []

    class Keep(SpanProcessor):
        def on_end(self, span: Any) -> None:
            ended.append(span)

    provider = TracerProvider()
    provider.add_span_processor(Keep())
    tracer = provider.get_tracer("webhook-poller")
    propagator = TraceContextTextMapPropagator()

    def lifecycle() -> None:
        for n in range(spans):
            parent = propagator.extract({"traceparent": PARENT})
            attributes: dict[str, str | int] = {
                "messaging.system": "webhook-poller", "messaging.operation.type": "send",
                "messaging.operation.name": "send", "messaging.destination.name": "bench",
                "messaging.message.id": str(n), "webhook_poller.attempt": 1,
                "webhook_poller.event_type": "order.paid", "http.request.method": "POST",
                "server.address": "hooks.example", "url.full": "https://hooks.example/in",
            }  # fmt: skip
            span = tracer.start_span(
                "send bench", context=parent, kind=SpanKind.CLIENT, attributes=attributes
            )
            span.set_attribute("webhook_poller.outcome", "delivered")
            span.set_attribute("http.response.status_code", 200)
            span.end()

    life = _cpu(lifecycle)
    encode = _cpu(lambda: [encode_spans(ended[k : k + BATCH]).SerializePartialToString()
                           for k in range(0, len(ended), BATCH)])  # fmt: skip
    return life / spans * 1e6, encode / spans * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spans", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    ours = min((_ours(args.spans) for _ in range(args.repeat)), key=sum)
    sdks = min((_sdks(args.spans) for _ in range(args.repeat)), key=sum)
    print(f"one attempt's span, CPU µs, best of {args.repeat} runs of {args.spans:,}:")
    print(f"  the poller's: {sum(ours):5.1f}  (start {ours[0]:.1f}, end {ours[1]:.1f}, "
          f"into a request {ours[2]:.1f})")  # fmt: skip
    print(f"  the SDK's:    {sum(sdks):5.1f}  (span {sdks[0]:.1f}, OTLP encoding {sdks[1]:.1f})")
    print(f"  the SDK's against the poller's: {sum(sdks) / sum(ours):.1f}×")


if __name__ == "__main__":
    main()
