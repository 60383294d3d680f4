"""Publishing to a Redis stream (``redis://host:port/DB?stream=NAME``, ``rediss://``) with
redis-py's asyncio client, behind the one seam (poller/deliver/wire.py);
poller/deliver/sending.py routes a broker URL here.

One script adds the entry and remembers its id, atomically (:data:`PUBLISH`): the
entry's fields are the request's headers (``webhook-id``, ``webhook-timestamp``,
``webhook-signature``, ``traceparent``, the ordering key and sequence …) and ``body``,
the payload; the key ``poller:webhook-id:{STREAM}:ID`` keeps the entry id for
:data:`DEDUPE_WINDOW`. A resend of an id the stream has — after an *unknown* outcome —
adds nothing and answers the entry it already is: the lookup and the resend are one
round trip. An id whose entry is no longer in the stream (trimmed, deleted, the stream
recreated) is added again: an operator's replay after a loss puts it back.
``maxlen=N`` trims the stream approximately (``XADD MAXLEN ~ N``).

*Delivered* is the script's answer: the entry is in the stream, as durable as the
server's persistence (AOF with ``appendfsync always`` for every write on disk).

==========================================================  ============================
what happened                                               attempt
==========================================================  ============================
the entry added, or found by its id                         delivered (Reply 200)
the server refused it (wrong type, out of memory, auth)     not sent (``BrokerRefused``)
no answer within the timeout, the connection lost           unknown (``PublishTimeout``,
                                                            ``ConnectionLost``)
==========================================================  ============================

redis-py's own retries are off: every publish is one send, counted.

**Publishes share a round trip.** The publishes of one turn of the event loop to a
destination — a claim's batch starts its deliveries together — go as one redis-py
pipeline (no transaction: each script call is atomic on its own, and its answer or
error is its delivery's alone). A pipeline costs one write and one read for all of
them where single calls cost a pooled connection, a write and a read each: at 64 in
flight, about half the poller's CPU per Redis delivery (docs/explanation/performance.md).
Each delivery still waits with its own timeout; a pipeline whose answers do not come
within the longest of them is cut (its connection closed), and whoever still waits is
told *unknown*. A server that lost the script (restarted, ``SCRIPT FLUSH``) answers
``NOSCRIPT`` without running it: the script is loaded and those calls sent once more —
the one resend that is not an attempt, as redis-py's own ``Script`` does.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

import redis.asyncio
import redis.exceptions
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError

from poller.deliver.broker_links import BrokerSender, LinkLost
from poller.deliver.wire import Reply, error_text
from poller.errors import SendError
from poller.observe.metrics import BROKER_CONNECTIONS
from poller.rules.destinations import Destination

if TYPE_CHECKING:
    from poller.endpoints.tls import TLSSettings

DEDUPE_WINDOW = 7 * 24 * 3600
"""Seconds a published id is remembered: longer than the default retry schedule's span
(5 s … 24 h, about 3.2 days over ten attempts)."""
BODY_FIELD = "body"

PUBLISH = """
local seen = redis.call('GET', KEYS[2])
if seen and #redis.call('XRANGE', KEYS[1], seen, seen) > 0 then return {seen, 1} end
local id
if ARGV[2] ~= '' then
  id = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[2], '*', unpack(ARGV, 3))
else
  id = redis.call('XADD', KEYS[1], '*', unpack(ARGV, 3))
end
redis.call('SET', KEYS[2], id, 'EX', ARGV[1])
return {id, 0}
"""
"""KEYS: the stream, the id's key; ARGV: the window, MAXLEN (or ''), then field, value …"""
PUBLISH_SHA = hashlib.sha1(PUBLISH.encode()).hexdigest()


async def _counted_connect(connection: Any) -> None:
    """Every connection the pool opens (the first and each reconnect), counted."""
    await connection.on_connect()
    BROKER_CONNECTIONS.labels("redis", "opened").inc()


def id_key(stream: str, message_id: str) -> str:
    """Where the id of a published message is kept (one hash slot with its stream)."""
    return f"poller:webhook-id:{{{stream}}}:{message_id}"


class _Pipeline:
    """The publishes of one loop turn to one client, sent as one pipeline."""

    def __init__(self, client: redis.asyncio.Redis) -> None:
        self.client = client
        self._queued: list[tuple[tuple[Any, ...], asyncio.Future[Any], float]] = []
        self._sending: set[asyncio.Task[None]] = set()

    def publish(self, args: tuple[Any, ...], left: float) -> asyncio.Future[Any]:
        """The script's answer to ``args`` (EVALSHA's), sent with this turn's others; the
        pipeline waits ``left`` seconds at least."""
        future = asyncio.get_running_loop().create_future()
        if not self._queued:  # the first of this turn: the send runs once the turn ends
            task = asyncio.create_task(self._send())
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)
        self._queued.append((args, future, left))
        return future

    async def _send(self) -> None:
        batch, self._queued = self._queued, []
        try:
            async with asyncio.timeout(max(left for _, _, left in batch)):
                answers = await self._run([args for args, _, _ in batch])
                lost = [n for n, a in enumerate(answers) if isinstance(a, NoScriptError)]
                if lost:  # not run: the server lost the script
                    await self.client.script_load(PUBLISH)
                    again = await self._run([batch[n][0] for n in lost])
                    for n, answer in zip(lost, again, strict=True):
                        answers[n] = answer
        except Exception as exc:  # the whole pipeline: every publish in it
            for _, future, _ in batch:
                if not future.done():
                    future.set_exception(TimeoutError() if isinstance(exc, TimeoutError) else exc)
            return
        except BaseException:  # closed (aclose): nobody waits for an answer any more
            for _, future, _ in batch:
                future.cancel()
            raise
        for (_, future, _), answer in zip(batch, answers, strict=True):
            if future.done():  # its delivery stopped waiting
                continue
            if isinstance(answer, Exception):
                future.set_exception(answer)
            else:
                future.set_result(answer)

    async def _run(self, calls: list[tuple[Any, ...]]) -> list[Any]:
        pipe = self.client.pipeline(transaction=False)
        for args in calls:
            pipe.execute_command("EVALSHA", PUBLISH_SHA, 2, *args)
        async with pipe:
            return await pipe.execute(raise_on_error=False)

    async def aclose(self) -> None:
        for task in list(self._sending):
            task.cancel()
        await asyncio.gather(*self._sending, return_exceptions=True)


class _Link(NamedTuple):
    client: redis.asyncio.Redis
    pipeline: _Pipeline


class RedisSender(BrokerSender[_Link]):
    """Stream publishes, a connection pool per destination (poller/deliver/broker_links.py)."""

    kind = "redis"
    counts_itself = True  # the pool opens connections: redis_connect_func counts each

    def __init__(self, *, limit: int = 0, **options: Any) -> None:
        super().__init__(**options)
        self._limit = limit or None

    async def _open(
        self, destination: Destination, address: str, budget: float, tls: TLSSettings | None
    ) -> _Link:
        options: dict[str, Any] = {}
        if destination.tls:
            options["ssl"] = True
            if tls is not None and tls.client_cert is not None:
                raise SendError(
                    "NotSupported", "a client certificate is not supported for rediss", sent=False
                )
            if tls is not None and tls.ca_bundle is not None:
                options["ssl_ca_data"] = tls.ca_bundle
        client = redis.asyncio.Redis(
            host=destination.host if destination.tls else address,
            port=destination.port,
            db=destination.db,
            username=destination.username or None,
            password=destination.password,
            socket_connect_timeout=min(self._connect_timeout, budget),
            retry=Retry(NoBackoff(), 0),  # one publish, one send: retries are the poller's
            max_connections=self._limit,
            client_name="webhook-poller",
            redis_connect_func=_counted_connect,
            **options,
        )
        try:
            await client.ping()
        except BaseException:
            await client.aclose()
            raise
        return _Link(client, _Pipeline(client))

    async def _close(self, link: _Link) -> None:
        await link.pipeline.aclose()
        await link.client.aclose()

    async def _publish(
        self,
        link: _Link,
        destination: Destination,
        headers: Mapping[str, str],
        body: bytes,
        left: float,
        timeout: float,
    ) -> Reply:
        stream = destination.stream
        args: list[Any] = [stream, id_key(stream, headers["webhook-id"]), DEDUPE_WINDOW,
                           destination.maxlen or ""]  # fmt: skip
        for name, value in headers.items():
            args += (name, value)
        args += (BODY_FIELD, body)
        try:
            async with asyncio.timeout(left):
                entry, duplicate = await link.pipeline.publish(tuple(args), left)
        except TimeoutError:
            raise SendError(
                "PublishTimeout", f"no answer within {timeout:g}s: maybe added", sent=True
            ) from None
        except redis.exceptions.ResponseError as exc:
            raise SendError("BrokerRefused", error_text(exc), sent=False) from None
        except (redis.exceptions.RedisError, OSError) as exc:
            raise LinkLost(SendError("ConnectionLost", error_text(exc), sent=True)) from None
        entry = entry.decode() if isinstance(entry, bytes) else str(entry)
        answer = {"stream": stream, "entry": entry, "duplicate": bool(duplicate)}
        return Reply(200, None, json.dumps(answer).encode())
