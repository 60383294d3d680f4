"""An OTLP/HTTP traces endpoint on 127.0.0.1 that decodes what it is sent (the protobuf,
with ``opentelemetry-proto``), for the tracing tests."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
from collections.abc import AsyncIterator
from typing import Any

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from tests.integration import servers


class Collector:
    """Every export request it got (``requests``: their headers) and every span in them;
    it answers ``status`` (None: never answers)."""

    def __init__(self, status: int | None = 200) -> None:
        self.status = status
        self.spans: list[Any] = []
        self.resources: list[Any] = []
        self.requests: list[dict[str, str]] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:  # keep-alive: requests one after another on a connection
            raw = await servers.read_request(reader)
            head, _, body = raw.partition(b"\r\n\r\n")
            first, *lines = head.decode().split("\r\n")
            headers = {k.lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines)}
            self.requests.append({**headers, "request": first})
            if headers.get("content-encoding") == "gzip":
                body = gzip.decompress(body)
            request = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
            for resource in request.resource_spans:
                self.resources.append(resource.resource)
                for scope in resource.scope_spans:
                    self.spans += list(scope.spans)
            if self.status is None:
                await asyncio.sleep(3600)
            answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
            writer.write(
                f"HTTP/1.1 {self.status} X\r\nContent-Type: application/x-protobuf\r\n".encode()
                + f"Content-Length: {len(answer)}\r\n\r\n".encode()
                + answer
            )
            await writer.drain()


@contextlib.asynccontextmanager
async def collector(status: int | None = 200) -> AsyncIterator[tuple[Collector, str]]:
    got = Collector(status)
    async with servers.raw_server(got.handle) as url:
        yield got, url


def attributes(span: Any) -> dict[str, Any]:
    """A decoded span's (or resource's) attributes, as a dict."""
    found = {}
    for kv in span.attributes:
        value = kv.value
        found[kv.key] = next(
            getattr(value, f) for f in ("string_value", "int_value", "bool_value", "double_value")
            if value.HasField(f)
        )  # fmt: skip
    return found
