"""Trace context through the outbox (poller/rules/tracing.py): captured by the enqueue's or the
publish's own insert when the application has a span, carried to the receiver as
``traceparent``; nothing stored, imported or sent without one."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator

import pytest
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from poller import Message, enqueue, enqueue_many, publish
from poller.endpoints.registry import create_endpoint
from poller.rules.tracing import capture, propagated
from tests.integration import servers
from tests.integration.helpers import wait_for
from tests.integration.service_helpers import fast_settings, running_poller

TRACE_ID = 0x0AF7651916CD43DD8448EB211C80319C
SPAN_ID = 0xB7AD6B7169203331
PARENT = f"00-{TRACE_ID:032x}-{SPAN_ID:016x}-01"


def _span() -> NonRecordingSpan:
    state = TraceState([("vendor", "opaque-1")])
    return NonRecordingSpan(
        SpanContext(
            TRACE_ID, SPAN_ID, is_remote=False, trace_flags=TraceFlags(1), trace_state=state
        )
    )


@pytest.fixture
async def seen() -> AsyncIterator[tuple[str, list[dict[str, str]]]]:
    got: list[dict[str, str]] = []

    async def capture_request(reader, writer):  # type: ignore[no-untyped-def]
        raw = await servers.read_request(reader)
        lines = raw.partition(b"\r\n\r\n")[0].decode().split("\r\n")
        got.append({k.lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:])})
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()

    async with servers.raw_server(capture_request) as url:
        yield url, got


def test_capture_reads_the_current_span_and_nothing_else() -> None:
    assert capture() is None  # no span current
    with trace.use_span(_span()):
        context = capture()
    assert context is not None
    assert context.traceparent == PARENT and context.tracestate == "vendor=opaque-1"


def test_without_opentelemetry_imported_nothing_is_imported() -> None:
    code = (
        "import sys; from poller.rules.tracing import capture;"
        "import poller.outbox.enqueue, poller.outbox.publish;"
        "assert capture() is None; assert not [m for m in sys.modules if 'opentelemetry' in m]"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    ("traceparent", "tracestate", "sent"),
    [
        (PARENT, "a=1", {"traceparent": PARENT, "tracestate": "a=1"}),
        (PARENT, "a=1\r\nX-Injected: 1", {"traceparent": PARENT}),
        ("00-" + "0" * 32 + "-b7ad6b7169203331-01", None, {}),
        ("00-zz\r\nX: 1", None, {}),
        ("01-" + PARENT[3:], None, {}),
        (None, None, {}),
    ],
)
def test_only_w3c_trace_context_is_ever_sent(
    traceparent: str | None, tracestate: str | None, sent: dict[str, str]
) -> None:
    assert propagated(traceparent, tracestate) == sent


async def test_the_receiver_continues_the_applications_trace(
    engine: Engine, db_url: str, seen: tuple[str, list[dict[str, str]]]
) -> None:
    url, got = seen
    with engine.begin() as conn:
        create_endpoint(conn, "billing", f"{url}/billing", event_types=["invoice.*"])
        create_endpoint(conn, "private", f"{url}/private", trace_context=False)
    with Session(engine) as session, session.begin(), trace.use_span(_span()):
        enqueue(
            session,
            endpoint="billing",
            event_type="invoice.paid",
            payload={"n": 1},
            idempotency_key="one",
        )
        enqueue_many(session, [Message("billing", "invoice.paid", {"n": 2}, "two",
                                       ordering_key="o1")])  # fmt: skip
        publish(session, event_type="invoice.sent", payload={"n": 3}, idempotency_key="three")
        enqueue(
            session,
            endpoint="private",
            event_type="invoice.paid",
            payload={"n": 4},
            idempotency_key="four",
        )
    with Session(engine) as session, session.begin():  # outside any span
        enqueue(
            session,
            endpoint="billing",
            event_type="invoice.paid",
            payload={"n": 5},
            idempotency_key="five",
        )
    with engine.connect() as conn:
        stored = dict(conn.execute(text(
            "SELECT o.idempotency_key, coalesce(o.traceparent, ev.traceparent) "
            "FROM poller_outbox o LEFT JOIN poller_events ev ON ev.id = o.event_id"
        )).all())  # fmt: skip
    assert stored == {"one": PARENT, "two": PARENT, "three": PARENT, "four": PARENT, "five": None}
    async with running_poller(db_url, fast_settings()):

        async def all_arrived() -> bool:
            return len(got) == 5

        await wait_for(all_arrived, timeout=10)
    by_key = {h["webhook-id"]: h for h in got}
    for key in ("one", "two", "three"):
        assert by_key[key]["traceparent"] == PARENT, key
        assert by_key[key]["tracestate"] == "vendor=opaque-1"
    assert "traceparent" not in by_key["four"]  # the endpoint refused it
    assert "traceparent" not in by_key["five"]  # no span: nothing


async def test_propagation_off_sends_nothing(
    engine: Engine, db_url: str, seen: tuple[str, list[dict[str, str]]]
) -> None:
    url, got = seen
    with engine.begin() as conn:
        create_endpoint(conn, "billing", f"{url}/billing")
    with Session(engine) as session, session.begin(), trace.use_span(_span()):
        enqueue(
            session,
            endpoint="billing",
            event_type="invoice.paid",
            payload={},
            idempotency_key="one",
        )
    async with running_poller(db_url, fast_settings(trace_propagation=False)):

        async def arrived() -> bool:
            return len(got) == 1

        await wait_for(arrived, timeout=10)
    assert "traceparent" not in got[0]


async def test_a_deliverys_log_lines_carry_its_trace(
    engine: Engine, db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    answers = [b"HTTP/1.1 500 X\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"]

    async def fail_once(reader, writer):  # type: ignore[no-untyped-def]
        await servers.read_request(reader)
        ok = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        writer.write(answers.pop() if answers else ok)
        await writer.drain()

    async with servers.raw_server(fail_once) as url:
        with engine.begin() as conn:
            create_endpoint(conn, "billing", f"{url}/billing")
        with Session(engine) as session, session.begin(), trace.use_span(_span()):
            enqueue(session, endpoint="billing", event_type="e", payload={}, idempotency_key="k")
        caplog.set_level("INFO", logger="poller.deliver.dispatcher")
        async with running_poller(db_url, fast_settings()):

            async def delivered() -> bool:
                with engine.connect() as conn:
                    return conn.execute(text("SELECT status FROM poller_outbox")).scalar() == (
                        "delivered"
                    )

            await wait_for(delivered, timeout=10)
    (retried,) = [r for r in caplog.records if "failed (HTTP 500), retrying" in r.getMessage()]
    assert retried.trace_id == f"{TRACE_ID:032x}"  # type: ignore[attr-defined]
    assert retried.span_id == f"{SPAN_ID:016x}"  # type: ignore[attr-defined]  # no exporter


async def test_the_latency_metric_names_a_deliverys_trace_in_openmetrics(
    engine: Engine, db_url: str, seen: tuple[str, list[dict[str, str]]]
) -> None:
    import httpx

    from poller.local.embedded import free_port

    url, got = seen
    port = free_port()
    with engine.begin() as conn:
        create_endpoint(conn, "exemplary", f"{url}/exemplary")
    with Session(engine) as session, session.begin(), trace.use_span(_span()):
        enqueue(session, endpoint="exemplary", event_type="e", payload={}, idempotency_key="x")
    async with running_poller(db_url, fast_settings(metrics_addr=f"127.0.0.1:{port}")):

        async def arrived() -> bool:
            return len(got) == 1

        await wait_for(arrived, timeout=10)
        async with httpx.AsyncClient() as http:
            metrics_url = f"http://127.0.0.1:{port}/metrics"
            open_metrics = (
                await http.get(metrics_url, headers={"Accept": "application/openmetrics-text"})
            ).text
            plain = (await http.get(metrics_url)).text
    bucket = "webhook_poller_commit_to_delivery_seconds_bucket"
    line = next(
        ln for ln in open_metrics.splitlines()
        if ln.startswith(bucket) and 'endpoint="exemplary"' in ln and "trace_id" in ln
    )  # fmt: skip
    assert f'trace_id="{TRACE_ID:032x}"' in line
    assert "trace_id" not in plain  # the Prometheus text format has no exemplars


def test_yes_no_options_take_true_or_false_not_a_word(engine: Engine) -> None:
    """bool("false") is True: a string was read as "send the trace context", and as
    "allow private targets"."""
    from poller.endpoints.registry import update_endpoint
    from poller.errors import InvalidEndpoint

    with engine.begin() as conn, pytest.raises(InvalidEndpoint, match="True or False"):
        create_endpoint(conn, "words", "https://x.example/h", trace_context="false")  # type: ignore[arg-type]
    with engine.begin() as conn:
        create_endpoint(conn, "words", "https://x.example/h")
        with pytest.raises(InvalidEndpoint, match="True or False"):
            update_endpoint(conn, "words", trace_context="no")  # type: ignore[arg-type]
        assert update_endpoint(conn, "words", trace_context=False).trace_context is False
        with pytest.raises(InvalidEndpoint, match="True or False"):  # "false" allowed 10.0.0.1
            create_endpoint(conn, "lan", "http://10.0.0.1/h", allow_private="false")  # type: ignore[arg-type]
