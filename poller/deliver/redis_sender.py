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
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import redis.asyncio
import redis.exceptions
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

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


async def _counted_connect(connection: Any) -> None:
    """Every connection the pool opens (the first and each reconnect), counted."""
    await connection.on_connect()
    BROKER_CONNECTIONS.labels("redis", "opened").inc()


def id_key(stream: str, message_id: str) -> str:
    """Where the id of a published message is kept (one hash slot with its stream)."""
    return f"poller:webhook-id:{{{stream}}}:{message_id}"


class RedisSender(BrokerSender[redis.asyncio.Redis]):
    """Stream publishes, a connection pool per destination (poller/deliver/broker_links.py)."""

    kind = "redis"
    counts_itself = True  # the pool opens connections: redis_connect_func counts each

    def __init__(self, *, limit: int = 0, **options: Any) -> None:
        super().__init__(**options)
        self._limit = limit or None
        self._script: Any = None

    async def _open(
        self, destination: Destination, address: str, budget: float, tls: TLSSettings | None
    ) -> redis.asyncio.Redis:
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
        return client

    async def _close(self, client: redis.asyncio.Redis) -> None:
        await client.aclose()

    async def _publish(
        self,
        client: redis.asyncio.Redis,
        destination: Destination,
        headers: Mapping[str, str],
        body: bytes,
        left: float,
        timeout: float,
    ) -> Reply:
        if self._script is None:
            self._script = client.register_script(PUBLISH)
        message_id = headers["webhook-id"]
        fields: list[Any] = []
        for name, value in headers.items():
            fields += (name, value)
        fields += (BODY_FIELD, body)
        keys = [destination.stream, id_key(destination.stream, message_id)]
        args = [DEDUPE_WINDOW, destination.maxlen or "", *fields]
        try:
            async with asyncio.timeout(left):
                entry, duplicate = await self._script(keys, args, client=client)
        except TimeoutError:
            raise SendError(
                "PublishTimeout", f"no answer within {timeout:g}s: maybe added", sent=True
            ) from None
        except redis.exceptions.ResponseError as exc:
            raise SendError("BrokerRefused", error_text(exc), sent=False) from None
        except (redis.exceptions.RedisError, OSError) as exc:
            raise LinkLost(SendError("ConnectionLost", error_text(exc), sent=True)) from None
        answer = {
            "stream": destination.stream,
            "entry": entry.decode() if isinstance(entry, bytes) else str(entry),
            "duplicate": bool(duplicate),
        }
        return Reply(200, None, json.dumps(answer).encode())
