"""The poller's spans as a collector gets them (poller/observe/otel.py,
poller/observe/otlp.py): encoded as the OTLP protobuf says, sampled as the SDK samples,
configured by the standard variables, and never in a delivery's way when the collector
is down, refuses, or never answers."""

from __future__ import annotations

import asyncio
import gzip
import random
import socket
import time
from datetime import UTC, datetime

import pytest
from opentelemetry.sdk.trace import sampling
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, set_span_in_context
from prometheus_client import REGISTRY

from poller.endpoints.registry import Endpoint
from poller.observe import otel, otlp
from poller.rules.outcomes import Attempt, ClaimedMessage, Verdict
from tests.integration.otlp_collector import attributes, collector

NOW = datetime(2026, 1, 1, tzinfo=UTC)
PARENT_TRACE, PARENT_SPAN = 0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331
PARENT = f"00-{PARENT_TRACE:032x}-{PARENT_SPAN:016x}-01"
PLANTED = "planted-otlp-credential-31"


def _endpoint() -> Endpoint:
    return Endpoint(
        id=1, name="billing", url=f"https://user:{PLANTED}@hooks.example/in?token={PLANTED}",
        lookup_url=f"https://hooks.example/status/{{idempotency_key}}?token={PLANTED}",
        enabled=True, disabled_reason=None, max_attempts=None, timeout=None,
        max_in_flight=None, bucket=0, created_at=NOW, updated_at=NOW, secret="s",
    )  # fmt: skip


def _message(
    traceparent: str | None = PARENT, tracestate: str | None = "vendor=1"
) -> ClaimedMessage:
    return ClaimedMessage(
        id=42, endpoint_id=1, bucket=0, event_type="order.paid", payload="{}",
        idempotency_key="k", attempts=3, max_attempts=5, claim_token=1,
        claim_expires_at=NOW, needs_lookup=False, created_at=NOW, endpoint_updated_at=NOW,
        traceparent=traceparent, tracestate=tracestate,
    )  # fmt: skip


def _dropped() -> float:
    return REGISTRY.get_sample_value("webhook_poller_spans_dropped_total") or 0.0


@pytest.fixture
def otlp_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ("OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER", "OTEL_TRACES_SAMPLER",
                 "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                 "OTEL_EXPORTER_OTLP_CERTIFICATE", "OTEL_EXPORTER_OTLP_COMPRESSION",
                 "OTEL_BSP_MAX_QUEUE_SIZE"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "billing-poller")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "20")
    return monkeypatch


async def test_export_is_on_only_when_asked_and_a_bad_setting_says_so(
    otlp_env: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    otlp_env.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    assert otel.setup() is None  # nothing asked
    otlp_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    otlp_env.setenv("OTEL_SDK_DISABLED", "true")
    assert otel.setup() is None
    otlp_env.delenv("OTEL_SDK_DISABLED")
    otlp_env.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    assert otel.setup() is None and "only http/protobuf is supported" in caplog.text
    otlp_env.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    otlp_env.setenv("OTEL_EXPORTER_OTLP_CERTIFICATE", "/nonexistent/ca.pem")
    assert otel.setup() is None
    assert "OTEL_EXPORTER_OTLP_CERTIFICATE: cannot load /nonexistent/ca.pem" in caplog.text
    otlp_env.delenv("OTEL_EXPORTER_OTLP_CERTIFICATE")
    otlp_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"file://me:{PLANTED}@x/y?{PLANTED}")
    assert otel.setup() is None and "is not an http(s) URL" in caplog.text
    otlp_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9/")
    otlp_env.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "soon")
    otlp_env.setenv("OTEL_TRACES_SAMPLER", "jaeger_remote")
    telemetry = otel.setup()
    assert telemetry is not None
    assert telemetry._exporter.config.endpoint == "http://127.0.0.1:9/v1/traces"
    assert telemetry._exporter.config.timeout == 10.0
    assert "'soon' is not a number of seconds" in caplog.text
    assert "jaeger_remote is not one of the standard samplers" in caplog.text
    assert PLANTED not in caplog.text
    await telemetry.close(1.0)


@pytest.mark.parametrize(
    ("name", "arg", "sdk"),
    [
        ("", "", sampling.ParentBased(sampling.ALWAYS_ON)),
        ("always_off", "", sampling.ALWAYS_OFF),
        ("traceidratio", "0.25", sampling.TraceIdRatioBased(0.25)),
        ("parentbased_traceidratio", "0.4", sampling.ParentBased(sampling.TraceIdRatioBased(0.4))),
        ("parentbased_always_off", "", sampling.ParentBased(sampling.ALWAYS_OFF)),
    ],
)
def test_the_samplers_decide_as_the_sdks(
    otlp_env: pytest.MonkeyPatch, name: str, arg: str, sdk: sampling.Sampler
) -> None:
    otlp_env.setenv("OTEL_TRACES_SAMPLER", name)
    otlp_env.setenv("OTEL_TRACES_SAMPLER_ARG", arg)
    ours = otel.sampler()
    rng = random.Random(5)
    for _ in range(400):
        trace_id = rng.getrandbits(128)
        for parent in (None, True, False):
            context = None
            if parent is not None:
                span = NonRecordingSpan(SpanContext(
                    trace_id, 1, is_remote=True, trace_flags=TraceFlags(int(parent))))  # fmt: skip
                context = set_span_in_context(span)
            theirs = sdk.should_sample(context, trace_id, "send").decision.is_sampled()
            assert ours(trace_id, parent) == theirs, (name, hex(trace_id), parent)


async def test_spans_reach_the_collector_as_the_protobuf_says(otlp_env: pytest.MonkeyPatch) -> None:
    async with collector() as (got, url):
        otlp_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", url)
        otlp_env.setenv(
            "OTEL_EXPORTER_OTLP_HEADERS", f"x-tenant=acme,authorization=Bearer%20{PLANTED}"
        )
        otlp_env.setenv("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")
        telemetry = otel.setup()
        assert telemetry is not None
        telemetry.start_exporting()
        endpoint = _endpoint()
        send = telemetry.start("send", endpoint, _message())
        lookup = telemetry.start("lookup", endpoint, _message(traceparent=None))
        assert send is not None and lookup is not None
        assert send.traceparent.startswith(
            f"00-{PARENT_TRACE:032x}-"
        ) and send.traceparent.endswith("-01")
        at = datetime.now(UTC)
        telemetry.finish(
            send, Attempt(Verdict.RETRY, at, 5.0, status_code=503), "retry", failed=True
        )
        telemetry.finish(
            lookup, Attempt(Verdict.DELIVERED, at, 1.0, status_code=200), "delivered", failed=False
        )
        telemetry.batch("claim", time.time_ns(), [PARENT, "00-garbage", PARENT])
        await telemetry.close(5.0)
    assert got.requests and all(r["content-encoding"] == "gzip" for r in got.requests)
    assert got.requests[0]["content-type"] == "application/x-protobuf"
    assert got.requests[0]["x-tenant"] == "acme"
    assert got.requests[0]["user-agent"].startswith("webhook-poller/")
    assert attributes(got.resources[0])["service.name"] == "billing-poller"
    spans = {s.name: s for s in got.spans}
    assert sorted(spans) == ["claim batch", "lookup billing", "send billing"]
    sent = spans["send billing"]
    assert sent.trace_id == PARENT_TRACE.to_bytes(16, "big")
    assert sent.parent_span_id == PARENT_SPAN.to_bytes(8, "big")
    assert sent.span_id.hex() == send.span_id and sent.trace_state == "vendor=1"
    assert sent.kind == 3 and sent.status.code == 2 and sent.flags & 0x301 == 0x301
    assert 0 < sent.start_time_unix_nano <= sent.end_time_unix_nano
    assert attributes(sent) == {
        "messaging.system": "webhook-poller", "messaging.operation.type": "send",
        "messaging.operation.name": "send", "messaging.destination.name": "billing",
        "messaging.message.id": "42", "webhook_poller.attempt": 3,
        "webhook_poller.event_type": "order.paid", "http.request.method": "POST",
        "server.address": "hooks.example", "url.full": "https://hooks.example/…",
        "webhook_poller.outcome": "retry", "http.response.status_code": 503, "error.type": "503",
    }  # fmt: skip
    looked = spans["lookup billing"]
    assert looked.trace_id.hex() == lookup.traceparent[3:35] and looked.parent_span_id == b""
    assert looked.status.code == 0 and attributes(looked)["url.full"] == "https://hooks.example/…"
    batch = spans["claim batch"]
    assert [link.span_id for link in batch.links] == [PARENT_SPAN.to_bytes(8, "big")] * 2
    assert attributes(batch)["messaging.batch.message_count"] == 3
    assert PLANTED not in str(got.spans) + str(got.resources)


async def test_not_sampled_is_not_recorded_but_still_named_to_the_receiver(
    otlp_env: pytest.MonkeyPatch,
) -> None:
    async with collector() as (got, url):
        otlp_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", url)
        telemetry = otel.setup()
        assert telemetry is not None
        telemetry.start_exporting()
        unsampled = _message(traceparent=PARENT[:-2] + "00")
        span = telemetry.start("send", _endpoint(), unsampled)
        assert span is not None and span.head is None
        assert span.traceparent[3:35] == PARENT[3:35] and span.traceparent.endswith("-00")
        assert span.traceparent[36:52] != PARENT[36:52]  # its own id, flagged not sampled
        telemetry.finish(
            span, Attempt(Verdict.DELIVERED, NOW, 1.0, status_code=200), "delivered", failed=False
        )
        await telemetry.close(2.0)
    assert got.spans == []


@pytest.mark.parametrize("collector_is", ["down", "hanging", "refusing"])
async def test_a_collector_that_fails_costs_a_delivery_nothing_and_is_counted(
    otlp_env: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, collector_is: str
) -> None:
    status = {"hanging": None, "refusing": 400, "down": 200}[collector_is]
    async with collector(status) as (got, url):
        if collector_is == "down":
            with socket.socket() as closed:
                closed.bind(("127.0.0.1", 0))
                url = f"http://127.0.0.1:{closed.getsockname()[1]}"  # refused
        otlp_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", url.replace("://", f"://me:{PLANTED}@"))
        otlp_env.setenv("OTEL_EXPORTER_OTLP_HEADERS", f"x-api-key={PLANTED}")
        otlp_env.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "0.3")
        otlp_env.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "50")
        otlp_env.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "10")
        otlp_env.setattr(otlp, "RETRIES", (0.05,))
        telemetry = otel.setup()
        assert telemetry is not None
        telemetry.start_exporting()
        before = _dropped()
        endpoint, msg = _endpoint(), _message()
        attempt = Attempt(Verdict.DELIVERED, NOW, 1.0, status_code=200)
        began = time.perf_counter()
        for _ in range(2000):  # far more than the queue holds
            span = telemetry.start("send", endpoint, msg)
            telemetry.finish(span, attempt, "delivered", failed=False)
        ended = time.perf_counter() - began
        for _ in range(100):  # what the exporter does with the first exports
            if collector_is == "refusing" and len(got.requests) >= 4:
                break
            await asyncio.sleep(0.02)
        stopping = time.perf_counter()
        await telemetry.close(0.5)
        stopped = time.perf_counter() - stopping
    assert ended < 2.0, ended  # ending a span queues it, or drops it: it never waits
    assert stopped < 1.5, stopped  # a stop waits for the collector a bounded time
    assert _dropped() - before == 2000  # not one span got through, and each is counted
    if collector_is == "refusing":  # refused: not retried, so no span is sent twice
        assert got.spans and len({s.span_id for s in got.spans}) == len(got.spans)
    warnings = [r.getMessage() for r in caplog.records if "exporting spans to" in r.getMessage()]
    assert len(warnings) == 1, warnings  # at most one a minute
    assert PLANTED not in caplog.text and "me@" not in caplog.text


async def test_an_export_the_collector_could_not_take_is_retried(
    otlp_env: pytest.MonkeyPatch,
) -> None:
    async with collector(503) as (got, url):
        otlp_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", url)
        otlp_env.setattr(otlp, "RETRIES", (0.05, 0.05))
        telemetry = otel.setup()
        assert telemetry is not None
        telemetry.start_exporting()
        before = _dropped()
        span = telemetry.start("send", _endpoint(), _message())
        telemetry.finish(span, Attempt(Verdict.DELIVERED, NOW, 1.0), "delivered", failed=False)
        for _ in range(200):
            if got.requests:
                got.status = 200  # the collector is back
                break
            await asyncio.sleep(0.01)
        await telemetry.close(2.0)
    assert len(got.requests) == 2 and len(got.spans) == 2  # the same span, sent twice
    assert got.spans[0] == got.spans[1] and _dropped() == before


def test_the_request_frames_encoded_spans_as_the_message_would() -> None:
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
    from opentelemetry.proto.common.v1 import common_pb2
    from opentelemetry.proto.resource.v1 import resource_pb2
    from opentelemetry.proto.trace.v1 import trace_pb2

    value = common_pb2.AnyValue(string_value="v" * 300)  # lengths past one varint byte
    resource = resource_pb2.Resource(attributes=[common_pb2.KeyValue(key="k", value=value)])
    scope = common_pb2.InstrumentationScope(name="webhook-poller", version="1")
    spans = [trace_pb2.Span(name="x" * n, span_id=bytes(8)) for n in (0, 1, 127, 128, 20000)]
    encoded = [s.SerializeToString() for s in spans]
    framed = otlp.request(resource.SerializeToString(), scope.SerializeToString(), encoded)
    scope_spans = trace_pb2.ScopeSpans(scope=scope, spans=spans)
    whole = trace_service_pb2.ExportTraceServiceRequest(
        resource_spans=[trace_pb2.ResourceSpans(resource=resource, scope_spans=[scope_spans])]
    )
    assert framed == whole.SerializeToString()
    assert gzip.decompress(gzip.compress(framed)) == framed


def test_the_spans_written_out_decode_as_the_messages_they_stand_for() -> None:
    from opentelemetry.proto.common.v1 import common_pb2
    from opentelemetry.proto.trace.v1 import trace_pb2

    attribute = otlp.StringAttribute("messaging.message.id")
    for value in ("", "7", "é" * 70, "x" * 127, "x" * 128, "x" * 300, "7"):  # varint edges
        kv = common_pb2.KeyValue(
            key="messaging.message.id", value=common_pb2.AnyValue(string_value=value)
        )
        expected = trace_pb2.Span(attributes=[kv])
        assert trace_pb2.Span.FromString(attribute(value)) == expected, len(value)
    for parent, state in ((b"", ""), (bytes(range(8)), "vendor=" + "v" * 200)):
        encoded = otlp.span_start(bytes(range(16)), b"\x01" * 8, parent, state, 0x301, 2**63 + 5)
        encoded += otlp.span_end(2**64 - 1)
        assert trace_pb2.Span.FromString(encoded) == trace_pb2.Span(
            trace_id=bytes(range(16)), span_id=b"\x01" * 8, parent_span_id=parent,
            trace_state=state, flags=0x301, start_time_unix_nano=2**63 + 5,
            end_time_unix_nano=2**64 - 1,
        )  # fmt: skip
