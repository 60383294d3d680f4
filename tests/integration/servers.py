"""Tiny hostile HTTP servers on 127.0.0.1 for delivery tests."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return head + (await reader.readexactly(length) if length else b"")


@contextlib.asynccontextmanager
async def raw_server(handler: Handler, tls: ssl.SSLContext | None = None) -> AsyncIterator[str]:
    """Serve ``handler`` per connection (over TLS with ``tls``); yields the base URL. Every
    connection is closed by the end, whatever the client keeps open."""

    open_writers: set[asyncio.StreamWriter] = set()
    tasks: set[asyncio.Task[None]] = set()

    async def guarded(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        open_writers.add(writer)
        task = asyncio.current_task()
        assert task is not None
        tasks.add(task)
        try:
            with contextlib.suppress(Exception):
                await handler(reader, writer)
        finally:
            writer.close()
            open_writers.discard(writer)
            tasks.discard(task)

    server = await asyncio.start_server(guarded, "127.0.0.1", 0, ssl=tls)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"{'http' if tls is None else 'https'}://127.0.0.1:{port}"
    finally:
        server.close()
        for task in list(tasks):
            task.cancel()
        for writer in list(open_writers):
            writer.transport.abort()
        await asyncio.sleep(0)
        await server.wait_closed()


async def close_after_request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await read_request(reader)  # read it all, then hang up without a word


async def endless_body(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await read_request(reader)
    writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    chunk = b"x" * 65536
    while True:
        writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        await writer.drain()


async def never_answers(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await read_request(reader)
    await asyncio.sleep(3600)


async def bad_status_line(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await read_request(reader)
    writer.write(b"HTTP/1.1 abc WHAT\r\n\r\n")
    await writer.drain()


def answer(status: int, headers: str = "", body: bytes = b"") -> Handler:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(
            f"HTTP/1.1 {status} X\r\nContent-Length: {len(body)}\r\n{headers}\r\n".encode(
                "utf-8", "surrogateescape"
            )
            + body
        )
        await writer.drain()

    return handler


def free_closed_port() -> str:
    from poller.local.embedded import free_port

    return f"http://127.0.0.1:{free_port()}"
