"""One trace from the application's request to the receiver, through a real ``poller run``
exporting over OTLP/HTTP to a collector on 127.0.0.1 that decodes the protobuf."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from poller import enqueue, publish
from poller.endpoints.registry import create_endpoint
from tests.acceptance.procs import poller_env, started
from tests.integration import servers
from tests.integration.otlp_collector import attributes, collector
from tests.integration.service_helpers import counts

PLANTED = "planted-span-secret-77"  # in a header, a query string and the payload: never in a span


@pytest.mark.slow
async def test_one_trace_from_the_request_to_the_receiver(
    engine: Engine, db_url: str, tmp_path: Path
) -> None:
    seen: list[dict[str, str]] = []
    dropped = {"drop-me": 1}  # its first send is read and left unanswered: unknown

    async def receive(reader, writer):  # type: ignore[no-untyped-def]  # one request a connection
        raw = await servers.read_request(reader)
        first, *lines = raw.partition(b"\r\n\r\n")[0].decode().split("\r\n")
        headers = {k.lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines)}
        seen.append({**headers, "request": first})
        if first.startswith("GET "):  # the lookup: not processed
            writer.write(
                b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            )
        elif dropped.get(headers["webhook-id"], 0) > 0:
            dropped[headers["webhook-id"]] -= 1
            writer.close()
            return
        else:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        await writer.drain()

    provider = TracerProvider()  # the application's own, in this process
    app = provider.get_tracer("shop")
    async with collector() as (spans, collector_url), servers.raw_server(receive) as url:
        with engine.begin() as conn:
            create_endpoint(
                conn, "billing", f"{url}/hook",
                lookup_url=f"{url}/lookup/{{idempotency_key}}?token={PLANTED}",
                headers={"Authorization": f"Bearer {PLANTED}"},
            )  # fmt: skip
            for name in ("ledger", "analytics"):
                create_endpoint(conn, name, f"{url}/{name}", event_types=["order.*"])
        with (
            app.start_as_current_span("POST /orders") as request_span,
            Session(engine) as session,
            session.begin(),
        ):
            for key in ("plain", "drop-me"):
                enqueue(session, endpoint="billing", event_type="order.paid",
                        payload={"note": PLANTED}, idempotency_key=key)  # fmt: skip
            publish(session, event_type="order.paid", payload={}, idempotency_key="ev")
        app_context = request_span.get_span_context()
        env = poller_env(
            POLLER_DATABASE_URL=db_url,
            OTEL_EXPORTER_OTLP_ENDPOINT=collector_url,
            OTEL_SERVICE_NAME="poller-under-test",
        )
        with started(["run", "--id", "traced"], env, tmp_path / "traced.log") as proc:
            for _ in range(600):
                if counts(engine) == {"delivered": 4}:
                    break
                await asyncio.sleep(0.05)
            assert counts(engine) == {"delivered": 4}
            await asyncio.to_thread(proc.stop)  # graceful: the spans are flushed
        assert proc.popen.returncode == 0, proc.output()
    trace_id = app_context.trace_id.to_bytes(16, "big")
    parent = app_context.span_id.to_bytes(8, "big")
    assert spans.spans, "no span exported"
    assert {attributes(r)["service.name"] for r in spans.resources} == {"poller-under-test"}
    by_name: dict[str, list[Any]] = {}
    for span in spans.spans:
        assert PLANTED not in str(span), span.name  # no header value, query or payload
        if span.name.endswith(" batch"):  # a trace of its own, linked to its messages'
            assert span.links and all(link.trace_id == trace_id for link in span.links)
            continue
        by_name.setdefault(span.name, []).append(span)
        assert span.trace_id == trace_id and span.parent_span_id == parent, span.name
    assert sorted((n, len(s)) for n, s in by_name.items()) == [
        ("lookup billing", 1), ("send analytics", 1), ("send billing", 3), ("send ledger", 1),
    ]  # fmt: skip
    lookup = attributes(by_name["lookup billing"][0])
    assert lookup["webhook_poller.outcome"] == "not_found"
    assert lookup["url.full"] == url + "/…"  # no path (the key), no query (the token)
    outcomes = sorted(attributes(s)["webhook_poller.outcome"] for s in by_name["send billing"])
    assert outcomes == ["delivered", "delivered", "unknown"]
    sent = attributes(by_name["send billing"][0])
    assert sent["messaging.system"] == "webhook-poller"
    assert sent["messaging.destination.name"] == "billing"
    assert sent["http.request.method"] == "POST"
    batches = {s.name for s in spans.spans if s.name.endswith(" batch")}
    assert batches == {"claim batch", "complete batch"}
    # each request carried its own attempt span as the receiver's parent
    exported = {s.span_id.hex() for s in spans.spans}
    for request in seen:
        _, trace_hex, span_hex, _ = request["traceparent"].split("-")
        assert trace_hex == trace_id.hex() and span_hex in exported, request["request"]


@pytest.mark.slow
async def test_sampling_off_exports_nothing_and_a_dead_collector_costs_nothing(
    engine: Engine, db_url: str, tmp_path: Path
) -> None:
    async def ok(reader, writer):  # type: ignore[no-untyped-def]
        await servers.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()

    app = TracerProvider().get_tracer("shop")
    async with collector() as (spans, collector_url), servers.raw_server(ok) as url:
        with engine.begin() as conn:
            create_endpoint(conn, "billing", f"{url}/hook")
        with app.start_as_current_span("POST /orders"), Session(engine) as session, session.begin():
            enqueue(session, endpoint="billing", event_type="e", payload={}, idempotency_key="one")
        env = poller_env(
            POLLER_DATABASE_URL=db_url,
            OTEL_EXPORTER_OTLP_ENDPOINT=collector_url,
            OTEL_TRACES_SAMPLER="always_off",
        )
        with started(["run", "--id", "unsampled"], env, tmp_path / "off.log") as proc:
            for _ in range(400):
                if counts(engine) == {"delivered": 1}:
                    break
                await asyncio.sleep(0.05)
            await asyncio.to_thread(proc.stop)
        assert counts(engine) == {"delivered": 1} and proc.popen.returncode == 0
    assert not spans.spans
