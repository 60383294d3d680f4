"""The fault hunt's rate-limited endpoints by the dozen: the governed claim's walk.

In a third of the seeds (drawn apart from the plan's other draws, which stay as
they were), :data:`COUNT` endpoints ``governed-N`` beside the hunt's one, each
with a rate limit of :data:`RATE` a second and a burst of :data:`BURST`, get
:data:`PER` messages each at the start, answered 200 by a receiver of their own;
every :data:`ORDERED_EVERY`-th endpoint's messages are on two ordering keys (a
key's next message is due once the one before has ended, with no NOTIFY: only a
governed claim takes it, and the poller that wrote the outcome must come back for
it, poller/claim/claimer.py ``Claimer.written``).
The governed claim takes them walking the governed endpoints in turn from where
its last claim stopped (poller/store/queries/health.py), under the hunt's kills,
freezes, restarts and cut connections. Then (:func:`disagrees`):

* none was sent faster than its limit, across pollers: between any two POSTs to
  one endpoint, the POSTs from the first to the second (both counted) are at most
  ``BURST + RATE × (seconds between them + SLACK)`` — a token is taken with the
  claim, and the POST follows within :data:`SLACK`. Tokens spent twice over (two
  pollers spending one) or not at all break it (a claim spending none: 8-16 POSTs
  in 0.7-2.7 s, seed 5); a claim or two more than the burst, within the slack,
  does not;
* no message was POSTed more often than sends are recorded for it, and every
  delivered one was POSTed;
* an ordering key's messages were first POSTed in the order of their positions
  (``webhook-ordering-seq``), each with its own position;
* and, as every message (loadtest/hunt_check.py), each settles: none is starved
  behind the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import threading
import time
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from poller import Message, enqueue_many
from poller.endpoints.registry import create_endpoint
from poller.rules.keyring import Keyring

COUNT = 20
RATE = 4.0
BURST = 1
PER = 24  # 5.75 s of tokens at RATE: spent twice over, 24 come in half that
SLACK = 1.0  # seconds from a claim to its POST: the request timeout
ORDERED_EVERY = 4  # every 4th endpoint's messages are ordered, on two keys


def governed(key: str) -> bool:
    """Whether an idempotency key is one of these endpoints' messages' (their receiver
    sees them, not the hunt's)."""
    return key.startswith("governed-")


def drawn(seed: int) -> bool:
    """Whether the seed runs the rate-limited endpoints (its own draw)."""
    return random.Random(seed * 7919 + 17).random() < 1 / 3


class Governed:
    """The rate-limited endpoints, their messages and their receiver: in the seeds that
    draw them (:func:`drawn`), else nothing at all."""

    def __init__(self, seed: int) -> None:
        self.on = drawn(seed)
        # (time.time(), webhook-id, webhook-ordering-key, webhook-ordering-seq) per POST
        self.posts: list[tuple[float, str, str, str]] = []
        self.port = 0
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._writers: set[asyncio.StreamWriter] = set()  # connections open now
        self._thread = threading.Thread(target=self._run, name="governed-receiver", daemon=True)

    def start(self) -> str:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the governed endpoints' receiver did not start")
        return f"http://127.0.0.1:{self.port}"

    def describe(self) -> str:
        return f"; {COUNT} rate-limited endpoints" if self.on else ""

    def stop(self) -> None:
        if self._loop is None or self._stop is None:  # never started
            return
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=5)

    def _run(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        async with server:
            await self._stop.wait()
        # The pollers' keep-alive connections, closed while the loop runs: left to the
        # collector after it, each one's socket and writer warned, and pytest failed the
        # test for those warnings (1,362 of them in seed 12).
        writers = list(self._writers)
        for writer in writers:
            writer.close()
        await asyncio.gather(*(w.wait_closed() for w in writers), return_exceptions=True)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            await self._answer(reader, writer)
        finally:  # cancelled too (the loop's end): the socket is closed, not collected
            self._writers.discard(writer)
            writer.close()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):  # a poller killed mid-request: its connection
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
                headers = {
                    name.strip().lower(): value.strip()
                    for name, _, value in (line.partition(":") for line in head[1:])
                }
                await reader.readexactly(int(headers.get("content-length", "0") or 0))
                if head[0].startswith("POST"):
                    self.posts.append(
                        (
                            time.time(),
                            headers.get("webhook-id", ""),
                            headers.get("webhook-ordering-key", ""),
                            headers.get("webhook-ordering-seq", ""),
                        )
                    )
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                await writer.drain()

    def prepare(self, conn: Any, keyring: Keyring) -> None:
        """The endpoints, at this receiver; their messages follow (:meth:`enqueue`)."""
        if not self.on:
            return
        url = self.start()
        for n in range(COUNT):
            create_endpoint(
                conn,
                f"governed-{n}",
                f"{url}/{n}",
                allow_private=True,
                keyring=keyring,
                rate_limit=RATE,
                rate_burst=BURST,
            )

    def enqueue(self, engine: Any) -> None:
        if not self.on:
            return
        with Session(engine) as session, session.begin():
            enqueue_many(
                session,
                [
                    Message(
                        f"governed-{n}",
                        "governed.event",
                        {"i": i},
                        f"governed-{n}:{i}",
                        ordering_key=f"k{i % 2}" if n % ORDERED_EVERY == 0 else None,
                    )
                    for i in range(PER)
                    for n in range(COUNT)
                ],
            )

    def disagrees(self, engine: Any) -> list[str]:
        """The invariants of the module docstring; one line per broken one."""
        if not self.on:
            return []
        with engine.connect() as conn:
            sends = dict(
                conn.execute(
                    text(
                        "SELECT o.idempotency_key, count(*) FROM poller_delivery_attempts a "
                        "JOIN poller_outbox o ON o.id = a.message_id "
                        "WHERE a.kind = 'send' AND o.idempotency_key LIKE 'governed-%' "
                        "GROUP BY 1"
                    )
                ).all()
            )
            ordered = dict(
                conn.execute(
                    text(
                        "SELECT idempotency_key, id FROM poller_outbox "
                        "WHERE ordering_key IS NOT NULL AND idempotency_key LIKE 'governed-%'"
                    )
                ).all()
            )
            delivered = {
                key
                for (key,) in conn.execute(
                    text(
                        "SELECT idempotency_key FROM poller_outbox "
                        "WHERE status = 'delivered' AND idempotency_key LIKE 'governed-%'"
                    )
                )
            }
        by_endpoint: dict[str, list[float]] = {}
        posted: dict[str, int] = {}
        for at, key, _, _ in self.posts:
            by_endpoint.setdefault(key.partition(":")[0], []).append(at)
            posted[key] = posted.get(key, 0) + 1
        problems = []
        faster = sorted(
            f"{name} ({count} POSTs in {seconds:.2f}s)"
            for name, times in by_endpoint.items()
            if (found := _fastest(sorted(times))) is not None
            for count, seconds in [found]
        )
        if faster:
            problems.append(f"{len(faster)} sent faster than their rate limit: {faster[:5]}")
        lost = sorted(delivered - set(posted))
        if lost:
            problems.append(f"{len(lost)} delivered but never POSTed (lost): {lost[:5]}")
        over = sorted(
            f"{k} ({n} > {sends.get(k, 0)})" for k, n in posted.items() if n > sends.get(k, 0)
        )
        if over:
            problems.append(f"{len(over)} POSTed more often than sends recorded: {over[:5]}")
        if wrong := _out_of_order(self.posts, ordered):
            problems.append(f"{len(wrong)} ordered messages out of order: {wrong[:5]}")
        return problems


def _out_of_order(posts: list[tuple[float, str, str, str]], ordered: dict[str, int]) -> list[str]:
    """Ordered messages first POSTed after a later one of their key, or POSTed with
    another position or key than theirs (an enqueued message's position is its id)."""
    wrong: list[str] = []
    first: dict[str, tuple[str, str]] = {}  # webhook-id -> (endpoint, key), by first POST
    for _, key, ordering_key, seq in posts:
        if key in ordered and seq != str(ordered[key]):
            wrong.append(f"{key} (position {seq!r}, key {ordering_key!r})")
        first.setdefault(key, (key.partition(":")[0], ordering_key))
    by_key: dict[tuple[str, str], list[str]] = {}
    for key, group in first.items():  # dicts keep the first POSTs' order
        if key in ordered:
            by_key.setdefault(group, []).append(key)
    for keys in by_key.values():
        wrong += [f"{b} before {a}" for a, b in itertools.pairwise(keys) if ordered[b] < ordered[a]]
    return sorted(wrong)


def _fastest(times: list[float]) -> tuple[int, float] | None:
    """The first run of POSTs (count, seconds) more than the limit allows, else None."""
    for i, first in enumerate(times):
        for j in range(i + 1, len(times)):
            count, seconds = j - i + 1, times[j] - first
            if count > BURST + RATE * (seconds + SLACK):
                return count, seconds
    return None
