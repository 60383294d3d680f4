"""A forward proxy on 127.0.0.1 for the proxy tests and the fault hunt: CONNECT tunnels and
absolute-form requests, basic auth, and the failures a real one has (a refused tunnel, a
hang, a 502).

It records what it was asked (``asked``: ``CONNECT 1.2.3.4:443``, ``POST http://…``),
how many connections it took and how many absolute-form requests it forwarded (one per
connection: it answers ``Connection: close``), and sends every upstream connection to
``upstream`` (127.0.0.1 and a port) when one is set — so a test target can have a global
address that the poller checks as global, while nothing leaves this machine.
:class:`ThreadedProxy` runs one on its own thread and event loop (the hunt's)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import threading
from typing import Any
from urllib.parse import urlsplit


class ForwardProxy:
    def __init__(
        self,
        *,
        credentials: tuple[str, str] | None = None,
        mode: str = "ok",  # ok | hang | refuse_tunnel | bad_gateway
        upstream: tuple[str, int] | None = None,
    ) -> None:
        self.credentials, self.mode, self.upstream = credentials, mode, upstream
        self.asked: list[str] = []
        self.connections = 0
        self.forwarded = 0  # absolute-form requests sent on to the receiver
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        for writer in list(self._writers):
            writer.transport.abort()
        await asyncio.sleep(0)
        if self._server is not None:
            await self._server.wait_closed()

    def _authorised(self, headers: dict[str, str]) -> bool:
        if self.credentials is None:
            return True
        expected = base64.b64encode(":".join(self.credentials).encode()).decode()
        return headers.get("proxy-authorization") == f"Basic {expected}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.add(writer)
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._serve(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            self._tasks.discard(task)
            writer.close()
            self._writers.discard(writer)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        line, *lines = head.decode("latin-1").split("\r\n")
        method, target, _ = line.split(" ", 2)
        self.asked.append(f"{method} {target}")
        headers = {k.strip().lower(): v.strip() for k, v in (h.split(":", 1) for h in lines if ":" in h)}  # fmt: skip  # noqa: E501
        if not self._authorised(headers):
            writer.write(
                b"HTTP/1.1 407 Proxy Authentication Required\r\n"
                b'Proxy-Authenticate: Basic realm="egress"\r\nContent-Length: 0\r\n\r\n'
            )
            await writer.drain()
            return
        if self.mode == "hang":
            await asyncio.sleep(3600)
        if method == "CONNECT":
            if self.mode == "refuse_tunnel":
                writer.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
                await writer.drain()
                return
            host, _, port = target.rpartition(":")
            up_reader, up_writer = await self._connect(host.strip("[]"), int(port))
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await writer.drain()
            await self._pipe(reader, writer, up_reader, up_writer)
            return
        if self.mode == "bad_gateway":  # as after the receiver dropped the connection
            writer.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
            return
        url = urlsplit(target)
        up_reader, up_writer = await self._connect(url.hostname or "", url.port or 80)
        path = (url.path or "/") + (f"?{url.query}" if url.query else "")
        kept = [h for h in lines if h and not h.lower().startswith(("proxy-", "connection:"))]
        up_writer.write(
            "\r\n".join([f"{method} {path} HTTP/1.1", *kept, "Connection: close", "", ""]).encode(
                "latin-1"
            )
        )
        self.forwarded += 1
        await self._forward(
            reader, writer, up_reader, up_writer, int(headers.get("content-length", "0") or 0)
        )

    async def _forward(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        up_reader: asyncio.StreamReader,
        up_writer: asyncio.StreamWriter,
        length: int,
    ) -> None:
        """The request's body on, then the answer back with ``Connection: close``: one
        request per connection to the proxy."""
        try:
            if length:
                up_writer.write(await reader.readexactly(length))
                await up_writer.drain()
            try:
                head = await up_reader.readuntil(b"\r\n\r\n")
            except asyncio.LimitOverrunError:  # a hostile receiver's endless head
                writer.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
                await writer.drain()
                return
            status, _, rest = head.partition(b"\r\n")
            kept = [h for h in rest.split(b"\r\n") if not h.lower().startswith(b"connection:")]
            writer.write(b"\r\n".join([status, b"Connection: close", *kept]))
            while chunk := await up_reader.read(65536):
                writer.write(chunk)
                await writer.drain()
        finally:
            up_writer.close()
            self._writers.discard(up_writer)

    async def _connect(
        self, host: str, port: int
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self.upstream is not None:
            host, port = self.upstream
        reader, writer = await asyncio.open_connection(host, port, limit=2**20)
        self._writers.add(writer)
        return reader, writer

    async def _pipe(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        up_reader: asyncio.StreamReader,
        up_writer: asyncio.StreamWriter,
    ) -> None:
        async def copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError):
                while chunk := await src.read(65536):
                    dst.write(chunk)
                    await dst.drain()
            with contextlib.suppress(OSError):
                dst.write_eof()

        try:
            await asyncio.gather(copy(reader, up_writer), copy(up_reader, writer))
        finally:
            up_writer.close()
            self._writers.discard(up_writer)


class ThreadedProxy:
    """A :class:`ForwardProxy` on its own thread and event loop, for a caller without one."""

    def __init__(self, **options: Any) -> None:
        self.proxy = ForwardProxy(**options)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._address = ""
        self._thread = threading.Thread(target=self._run, name="forward-proxy", daemon=True)

    def start(self) -> str:
        """Its ``host:port``."""
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the forward proxy did not start")
        return self._address

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=10)

    def _run(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._address = await self.proxy.start()
        self._ready.set()
        await self._stop.wait()
        await self.proxy.stop()
