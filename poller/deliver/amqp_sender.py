"""Publishing to RabbitMQ (``amqp://…?exchange=E&routing_key=K``, ``amqps://``) with aio-pika,
behind the one seam (poller/deliver/wire.py); poller/deliver/sending.py routes a broker
URL here.

Each destination has one connection and one channel in confirm mode; messages are
persistent (delivery mode 2) and *mandatory*, so a message no queue takes comes back
instead of vanishing. *Delivered* is the broker's confirm (``basic.ack``): with a
durable queue bound, the message is on disk. The message carries ``message_id`` =
``webhook-id``, ``content_type``, a ``timestamp`` and the request's headers
(``webhook-id``, ``webhook-timestamp``, ``webhook-signature``, ``traceparent``, the
ordering key and sequence) as AMQP headers.

RabbitMQ cannot drop a second copy: a resend after an *unknown* outcome may be
queued twice, and a consumer dedupes on ``message_id`` as a Standard Webhooks receiver
does on ``webhook-id`` (docs/how-to/rabbitmq.md).

==========================================================  ============================
what happened                                               attempt
==========================================================  ============================
``basic.ack``                                               delivered (Reply 200)
returned unroutable (no queue bound for the routing key)    not sent (``Unroutable``)
the exchange does not exist (channel closed 404)            not sent (``NoExchange``)
access refused to the exchange (403)                        not sent (``BrokerRefused``)
``basic.nack``: the broker lost it, maybe in part           unknown (``Nacked``)
no confirm within the timeout, the connection lost after    unknown (``PublishTimeout``,
publishing                                                  ``ConnectionLost``)
==========================================================  ============================
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import aio_pika
import aiormq.exceptions
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractExchange

from poller.deliver.broker_links import BrokerSender, LinkLost
from poller.deliver.wire import Reply, error_text
from poller.errors import SendError
from poller.rules.destinations import Destination

if TYPE_CHECKING:
    from poller.endpoints.tls import TLSSettings

_OWN_PROPERTIES = frozenset({"content-type"})  # sent as the message's properties instead


class Link:
    """A connection, its channel in confirm mode and the exchanges it published to."""

    __slots__ = ("channel", "connection", "exchanges")

    def __init__(self, connection: AbstractConnection, channel: AbstractChannel) -> None:
        self.connection = connection
        self.channel = channel
        self.exchanges: dict[str, AbstractExchange] = {}

    async def exchange(self, name: str) -> AbstractExchange:
        found = self.exchanges.get(name)
        if found is None:
            if name:
                found = await self.channel.get_exchange(name, ensure=False)
            else:
                found = self.channel.default_exchange
            self.exchanges[name] = found
        return found


class AmqpSender(BrokerSender[Link]):
    """Confirmed publishes to RabbitMQ, a connection per destination
    (poller/deliver/broker_links.py)."""

    kind = "amqp"

    async def _open(
        self, destination: Destination, address: str, budget: float, tls: TLSSettings | None
    ) -> Link:
        options: dict[str, Any] = {}
        if destination.tls:
            options["ssl"] = True
            options["ssl_context"] = ssl.create_default_context() if tls is None else tls.context()
        connection = await aio_pika.connect(
            host=destination.host if destination.tls else address,
            port=destination.port,
            login=destination.username or "guest",
            password=destination.password or "guest",
            virtualhost=destination.vhost,
            timeout=budget,
            client_properties={"connection_name": "webhook-poller"},
            **options,
        )
        try:
            channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        except BaseException:
            await connection.close()
            raise
        return Link(connection, channel)

    async def _close(self, link: Link) -> None:
        await link.connection.close()

    def _usable(self, link: Link) -> bool:
        return not (link.connection.is_closed or link.channel.is_closed)

    async def _publish(
        self,
        link: Link,
        destination: Destination,
        headers: Mapping[str, str],
        body: bytes,
        left: float,
        timeout: float,
    ) -> Reply:
        try:
            exchange = await link.exchange(destination.exchange)
        except aiormq.exceptions.AMQPError as exc:
            raise LinkLost(SendError("ConnectError", error_text(exc), sent=False)) from None
        message = aio_pika.Message(
            body,
            headers={k: v for k, v in headers.items() if k.lower() not in _OWN_PROPERTIES},
            content_type=headers.get("Content-Type", "application/json"),
            message_id=headers["webhook-id"],
            timestamp=datetime.now(UTC),
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        )
        try:
            await exchange.publish(message, destination.routing_key, mandatory=True, timeout=left)
        except aiormq.exceptions.PublishError as exc:
            returned = getattr(exc.message, "delivery", None)
            raise SendError(
                "Unroutable",
                f"returned unroutable: {getattr(returned, 'reply_text', '')} (exchange "
                f"{destination.exchange!r}, routing key {destination.routing_key!r})",
                sent=False,
            ) from None
        except aiormq.exceptions.DeliveryError:
            raise SendError("Nacked", "the broker nacked it: maybe queued", sent=True) from None
        except aiormq.exceptions.ChannelNotFoundEntity as exc:
            raise LinkLost(SendError("NoExchange", _reason(exc), sent=False)) from None
        except aiormq.exceptions.ChannelAccessRefused as exc:
            raise LinkLost(SendError("BrokerRefused", _reason(exc), sent=False)) from None
        except TimeoutError:
            raise SendError(
                "PublishTimeout", f"no confirm within {timeout:g}s: maybe queued", sent=True
            ) from None
        except (aiormq.exceptions.AMQPError, ConnectionError, RuntimeError) as exc:
            raise LinkLost(SendError("ConnectionLost", error_text(exc), sent=True)) from None
        answer = {"exchange": destination.exchange, "routing_key": destination.routing_key}
        return Reply(200, None, json.dumps(answer).encode())


def _reason(exc: aiormq.exceptions.AMQPError) -> str:
    """A channel's close reason as the broker said it (``NOT_FOUND - no exchange 'x' …``)."""
    frame = exc.args[0] if exc.args else None
    text = getattr(frame, "reply_text", None) or str(exc)
    return str(text)[:500]
