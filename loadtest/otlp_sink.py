"""An OTLP/HTTP traces endpoint on its own thread, for the tracing benchmark and the fault
hunt: it counts the export requests it got and answers 200 (``hang``: never answers)."""

from __future__ import annotations

import asyncio
import contextlib
import threading


class Sink:
    """An OTLP/HTTP endpoint on its own thread: answers 200 (``hang``: never answers)."""

    def __init__(self, *, hang: bool = False) -> None:
        self.hang, self.requests, self.port = hang, 0, 0
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._serve()), daemon=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._answer(reader, writer)
        except asyncio.CancelledError:  # stopping: end quietly (3.11 logs a cancelled handler)
            pass
        finally:
            self._tasks.discard(task)
            writer.close()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (int(h.split(b":", 1)[1]) for h in head.split(b"\r\n")
                     if h.lower().startswith(b"content-length:")), 0,
                )  # fmt: skip
                await reader.readexactly(length)
                self.requests += 1
                if self.hang:
                    await asyncio.sleep(3600)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                await writer.drain()

    async def _serve(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        await self._stop.wait()
        server.close()
        for task in list(self._tasks):  # the exporters' kept-alive (or hung) connections
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def __enter__(self) -> str:
        self._thread.start()
        self._ready.wait(10)
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=5)
