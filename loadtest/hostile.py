"""A receiver whose every answer is drawn at random from what real servers get wrong.

Used by the fault hunt (loadtest/hunt.py). A raw asyncio HTTP/1.1 server on
127.0.0.1, running on its own thread and event loop, so the hunt can read its
counts directly. For each request it draws one behaviour from a seeded RNG:

* honest answers: 200/201/204 (the message is *applied* first), 3xx, 4xx, 5xx
  with bodies an operator reads later (markup, terminal escapes, NUL, bad UTF-8);
* ``429``/``503`` with a ``Retry-After`` that is valid, huge, negative,
  non-ASCII (``²``), a date, or garbage;
* hangs past the sender's timeout (applied or not); a reset before the body
  is read, or after (applied or not); garbage bytes for an answer; a megabyte
  of headers; an oversized or slowly dripped body after a 2xx; an answer with
  no length that ends with the connection; an impossible status code.

The lookup (``GET /lookup/<key>``) is honest most of the time (200 if applied,
404 if not) and otherwise fails, hangs or resets.

During an *outage* (:meth:`HostileReceiver.down_for`) every request is answered
``503`` with no ``Retry-After``: the endpoint's circuit opens and its backlog
waits, long enough to age out past the endpoint's ``max_age``.

It records what the invariants need: POSTs that *arrived* per key (counted
when the request head is read, before anything else is decided), the keys it
applied (every 2xx is preceded by applying), and — given the endpoint's secret
— the keys of POSTs whose Standard Webhooks signature did not verify.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
import time
from collections import Counter
from urllib.parse import unquote

from poller.local.receiver import verify
from poller.rules.signing import Verifier

HANG = 3.0  # longer than the hunt's request timeout

RETRY_AFTERS = [
    b"0",
    b"1",
    b"2",
    b"-1",
    "²".encode(),
    "٣".encode(),
    b"1e3",
    b"99999999999999999999999",
    b"9" * 300,
    b"Wed, 21 Oct 2015 07:28:00 GMT",
    b"Fri, 31 Dec 9999 23:59:59 GMT",
    b"Mon, 32 Foo 2026 25:61:61 GMT",
    b"soon",
    b"",
    b"\xff\xfe",
]

# Error bodies: what an operator later reads as a response excerpt and an error, in a
# page, a table, --json and the logs (markup, terminal escapes, C1 CSI, bidi, NUL,
# invalid UTF-8, forged lines).
ERROR_BODIES = [
    b"nope",
    b"<script>alert(1)</script><img src=x onerror=alert(2)>",
    b"[/x] [link=http://evil.example]click[/link] [bold red]",
    b"\x1b]52;c;aGk=\x07\x1b[2J\x1b[31m",
    "\x9b31m \u202e \u0000".encode(),
    b"\x00\xff\xfe",
    b'line one\r\n{"level": "error", "message": "forged"}\n',
    b"%s%n{0}${jndi:ldap://x}",
]

# (behaviour, weight)
POST_BEHAVIOURS = [
    ("ok", 40),
    ("ok_other_2xx", 5),
    ("status", 10),
    ("retry_after", 10),
    ("hang", 4),
    ("reset_before_body", 3),
    ("reset_after_body", 3),
    ("apply_then_reset", 4),
    ("garbage", 3),
    ("huge_headers", 2),
    ("huge_body", 2),
    ("drip_body", 2),
    ("no_length_close", 2),
    ("bad_status", 2),
]
# A 2xx is only ever sent after applying; these failures applied the message, or may have.
APPLIED_FIRST = {
    "ok",
    "ok_other_2xx",
    "huge_body",
    "drip_body",
    "no_length_close",
    "huge_headers",
    "apply_then_reset",
}
MAYBE_APPLIED = {"hang", "garbage", "bad_status"}
LOOKUP_BEHAVIOURS = [("honest", 70), ("status", 10), ("hang", 10), ("reset", 10)]


def _draw(rng: random.Random, table: list[tuple[str, int]]) -> str:
    names, weights = zip(*table, strict=True)
    return rng.choices(names, weights)[0]


class HostileReceiver:
    def __init__(
        self, seed: int, secret: str | None = None, credential: tuple[str, str] | None = None
    ) -> None:
        self.rng = random.Random(seed)
        self.credential = (credential[0].lower(), credential[1]) if credential else None
        self.uncredentialed: set[str] = set()  # keys of requests without the credential
        self.keys = [secret] if secret else []  # whsec_ secrets, whpk_ public keys
        self.verifier = Verifier(self.keys)
        self.posts: Counter[str] = Counter()  # key -> POSTs that arrived
        self.applied: set[str] = set()
        self.badly_signed: set[str] = set()
        self.first_arrival: dict[str, int] = {}  # key -> rank of its first POST's arrival
        self.last_arrival: dict[str, float] = {}  # key -> time.time() its last request came
        self.traces: dict[str, set[str]] = {}  # key -> trace ids of its requests ('' for none)
        self.positions: dict[str, set[int]] = {}  # key -> webhook-ordering-seq values it came with
        self.behaviours: Counter[str] = Counter()
        self.lookups = 0
        self.down_until = 0.0  # time.monotonic() an outage ends: 503 to all until then
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hostile-receiver", daemon=True)

    def down_for(self, seconds: float) -> None:
        """An outage from now: every request answered 503, no Retry-After."""
        self.down_until = time.monotonic() + seconds

    def _down(self) -> bool:
        if time.monotonic() >= self.down_until:
            return False
        self.behaviours["outage"] += 1
        return True

    def add_secret(self, key: str) -> None:
        """A rotated key (a secret or a public key): signatures under it verify too (the old
        one's still do)."""
        self.keys = [*self.keys, key]
        self.verifier = Verifier(self.keys)

    # -- lifecycle (from the hunt's thread) -----------------------------------------

    def start(self) -> str:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the hostile receiver did not start")
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=10)

    def _run(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._connection, "127.0.0.1", 0, limit=2**20)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        async with server:
            await self._stop.wait()
            server.close()

    # -- one connection -------------------------------------------------------------------

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception, asyncio.CancelledError):
            while await self._one(reader, writer):
                pass
        with contextlib.suppress(Exception):
            writer.transport.abort()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """One request; True to keep the connection for the next one."""
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, path = lines[0].split(" ")[:2]
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0") or 0)
        if self.credential and headers.get(self.credential[0]) != self.credential[1]:
            self.uncredentialed.add(headers.get("webhook-id", path))  # the endpoint's header
        parent = headers.get("traceparent", "")  # the trace it came in: its trace id
        self.traces.setdefault(headers.get("webhook-id", path), set()).add(parent[3:35])
        if method == "GET" and path.startswith("/lookup/"):
            await reader.readexactly(length)
            if self._down():
                self.lookups += 1
                return await self._unavailable(writer)
            return await self._lookup(unquote(path.removeprefix("/lookup/")), writer)
        key = headers.get("webhook-id", "")
        self.posts[key] += 1
        self.first_arrival.setdefault(key, len(self.first_arrival))
        self.last_arrival[key] = time.time()
        if "webhook-ordering-seq" in headers:
            seq = headers["webhook-ordering-seq"]
            self.positions.setdefault(key, set()).add(int(seq) if seq.isdigit() else -1)
        if self._down():
            await reader.readexactly(length)
            return await self._unavailable(writer)
        behaviour = _draw(self.rng, POST_BEHAVIOURS)
        self.behaviours[behaviour] += 1
        if behaviour == "reset_before_body":
            writer.transport.abort()
            return False
        body = await reader.readexactly(length)
        raw = {name.encode("latin-1"): value.encode("latin-1") for name, value in headers.items()}
        if self.verifier and not verify(self.verifier, raw, body, time.time()):
            self.badly_signed.add(key)
        return await self._answer(behaviour, key, writer)

    async def _answer(self, behaviour: str, key: str, writer: asyncio.StreamWriter) -> bool:
        """Answer as ``behaviour`` says; True to keep the connection."""
        if behaviour in APPLIED_FIRST or (behaviour in MAYBE_APPLIED and self.rng.random() < 0.5):
            self.applied.add(key)  # every 2xx (and some failures) comes after applying
        keep = await getattr(self, f"_{behaviour}")(writer)
        await writer.drain()
        return bool(keep)

    async def _unavailable(self, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 503 X\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        return True

    async def _ok(self, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        return True

    async def _ok_other_2xx(self, writer: asyncio.StreamWriter) -> bool:
        status = self.rng.choice([201, 202, 204])
        writer.write(b"HTTP/1.1 %d X\r\nContent-Length: 0\r\n\r\n" % status)
        return True

    async def _status(self, writer: asyncio.StreamWriter) -> bool:
        status = self.rng.choice([301, 302, 400, 401, 404, 409, 422, 500, 502, 503])
        body = self.rng.choice(ERROR_BODIES)
        writer.write(b"HTTP/1.1 %d X\r\nContent-Length: %d\r\n\r\n%s" % (status, len(body), body))
        return True

    async def _retry_after(self, writer: asyncio.StreamWriter) -> bool:
        status, value = self.rng.choice([429, 503]), self.rng.choice(RETRY_AFTERS)
        writer.write(
            b"HTTP/1.1 %d X\r\nRetry-After: %s\r\nContent-Length: 0\r\n\r\n" % (status, value)
        )
        return True

    async def _hang(self, writer: asyncio.StreamWriter) -> bool:
        await asyncio.sleep(HANG)  # maybe processed, and the answer never comes
        return False

    async def _reset_after_body(self, writer: asyncio.StreamWriter) -> bool:
        writer.transport.abort()
        return False

    _apply_then_reset = _reset_after_body

    async def _garbage(self, writer: asyncio.StreamWriter) -> bool:
        writer.write(self.rng.choice([b"\x00\xff\xfe garbage\r\n\r\n", b"HTTP/9 what\r\n\r\n"]))
        return False

    async def _huge_headers(self, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * (1024 * 1024) + b"\r\n\r\n")
        return False

    async def _huge_body(self, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2000000\r\n\r\n" + b"x" * 2_000_000)
        return False

    async def _drip_body(self, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
        for _ in range(20):
            writer.write(b"x")
            await writer.drain()
            await asyncio.sleep(0.1)
        return False

    async def _no_length_close(self, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.0 200 OK\r\n\r\nok, bye")
        return False

    async def _bad_status(self, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 999 Whatever\r\nContent-Length: 0\r\n\r\n")
        return False

    async def _lookup(self, key: str, writer: asyncio.StreamWriter) -> bool:
        self.lookups += 1
        self.last_arrival[key] = time.time()
        behaviour = _draw(self.rng, LOOKUP_BEHAVIOURS)
        if behaviour == "honest":
            found = key in self.applied
            writer.write(b"HTTP/1.1 %d X\r\nContent-Length: 0\r\n\r\n" % (200 if found else 404))
        elif behaviour == "status":
            writer.write(b"HTTP/1.1 500 X\r\nContent-Length: 0\r\n\r\n")
        elif behaviour == "hang":
            await asyncio.sleep(HANG)
            return False
        else:
            writer.transport.abort()
            return False
        await writer.drain()
        return True
