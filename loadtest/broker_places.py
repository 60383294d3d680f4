"""The brokers a test or the hunt delivers to, read back as a consumer reads them:
JetStream, RabbitMQ and Redis streams, each with a stream or queue of the caller's own
(tests/integration/test_brokers.py, loadtest/hunt_brokers.py, loadtest/brokers_bench.py)."""

from __future__ import annotations

import contextlib
import uuid
from dataclasses import dataclass
from typing import Any

import aio_pika
import nats
import redis.asyncio
from nats.js.api import StreamConfig


@dataclass
class Got:
    """A message as its consumer has it."""

    headers: dict[str, str]
    body: bytes

    @property
    def id(self) -> str:
        return self.headers["webhook-id"]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class Place:
    """A stream or queue of one broker: made, read back, removed."""

    kind = ""

    def __init__(self) -> None:
        self.name = f"t{uuid.uuid4().hex[:12]}"
        self.got: list[Got] = []

    @property
    def url(self) -> str:
        raise NotImplementedError

    async def __aenter__(self) -> Place:
        await self.open()
        await self.create()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.remove()
        await self.close()

    async def open(self) -> None: ...
    async def close(self) -> None: ...
    async def create(self) -> None: ...
    async def remove(self) -> None: ...

    async def read(self) -> list[Got]:
        """Every message so far, in the order the broker keeps them."""
        raise NotImplementedError

    async def ids(self) -> list[str]:
        return [g.id for g in await self.read()]


class NatsPlace(Place):
    kind = "nats"

    def __init__(self, server: str, window: float = 3600) -> None:
        super().__init__()
        self.server = server
        self.window = window

    @property
    def url(self) -> str:
        return f"{self.server}/{self.name}.events"

    async def open(self) -> None:
        self.nc = await nats.connect(self.server)
        self.js = self.nc.jetstream()

    async def close(self) -> None:
        await self.nc.close()

    async def create(self) -> None:
        config = StreamConfig(
            name=self.name, subjects=[f"{self.name}.>"], duplicate_window=self.window
        )
        await self.js.add_stream(config)

    async def remove(self) -> None:
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await self.js.delete_stream(self.name)

    async def read(self) -> list[Got]:
        info = await self.js.stream_info(self.name)
        got = []
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            if info.state.messages == 0:
                break
            msg = await self.js.get_msg(self.name, seq)
            got.append(Got({k: _text(v) for k, v in (msg.headers or {}).items()}, msg.data or b""))
        return got


class AmqpPlace(Place):
    kind = "amqp"

    def __init__(self, server: str) -> None:
        super().__init__()
        self.server = server

    @property
    def url(self) -> str:
        return f"{self.server}?routing_key={self.name}"

    async def open(self) -> None:
        self.connection = await aio_pika.connect(self.server)
        self.channel = await self.connection.channel()

    async def close(self) -> None:
        await self.connection.close()

    async def create(self) -> None:
        await self.channel.declare_queue(self.name, durable=True)

    async def remove(self) -> None:
        await self.channel.queue_delete(self.name)

    async def read(self) -> list[Got]:
        queue = await self.channel.get_queue(self.name)  # on this connection's loop
        while (message := await queue.get(no_ack=True, fail=False)) is not None:
            headers = {k: _text(v) for k, v in (message.headers or {}).items()}
            assert message.message_id == headers["webhook-id"]
            assert message.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
            self.got.append(Got(headers, message.body))
        return list(self.got)


class RedisPlace(Place):
    kind = "redis"

    def __init__(self, server: str) -> None:
        super().__init__()
        self.server = server

    @property
    def url(self) -> str:
        return f"{self.server}?stream={self.name}"

    async def open(self) -> None:
        self.client = redis.asyncio.Redis.from_url(self.server)

    async def close(self) -> None:
        await self.client.aclose()

    async def remove(self) -> None:
        await self.client.delete(self.name)

    async def read(self) -> list[Got]:
        got = []
        for _, fields in await self.client.xrange(self.name):
            text = {_text(k): v for k, v in fields.items()}
            body = text.pop("body")
            got.append(Got({k: _text(v) for k, v in text.items()}, body))
        return got


def place(kind: str, servers: dict[str, str]) -> Place:
    """A new place of ``kind`` on the servers given (``nats``, ``amqp``, ``redis``: URLs)."""
    made = {"nats": NatsPlace, "amqp": AmqpPlace, "redis": RedisPlace}[kind]
    return made(servers[kind])  # type: ignore[abstract]
