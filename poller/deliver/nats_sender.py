"""Publishing to NATS JetStream (``nats://host:port/SUBJECT``, ``nats+tls://``) with nats-py,
behind the one seam (poller/deliver/wire.py); poller/deliver/sending.py routes a broker
URL here.

*Delivered* is JetStream's PubAck: the stream stored the message. The message carries
the request's headers — ``webhook-id``, ``webhook-timestamp``, ``webhook-signature``,
``traceparent``, the ordering key and sequence — and ``Nats-Msg-Id`` = ``webhook-id``,
on which JetStream drops a second copy within the stream's duplicate window
(``duplicate_window``, 2 minutes by default): a resend after an *unknown* outcome is
acknowledged ``duplicate`` instead of stored twice. Past the window a resend is stored
again, and a consumer dedupes on ``Nats-Msg-Id`` (docs/how-to/brokers.md says how long
to make the window).

==========================================================  ============================
what happened                                               attempt
==========================================================  ============================
PubAck (``duplicate`` too)                                  delivered (Reply 200)
no stream listens on the subject (no responders)            not sent (``NoStream``)
the stream refused it (an API error: limits, sealed …)      not sent (``BrokerRefused``)
no PubAck within the timeout, the connection lost after     unknown (``PublishTimeout``,
publishing                                                  ``ConnectionLost``)
==========================================================  ============================
"""

from __future__ import annotations

import json
import logging
import ssl
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js import JetStreamContext

from poller.deliver.broker_links import BrokerSender, LinkLost
from poller.deliver.wire import Reply, error_text
from poller.errors import SendError
from poller.rules.destinations import Destination

if TYPE_CHECKING:
    from poller.endpoints.tls import TLSSettings

MSG_ID = "Nats-Msg-Id"
log = logging.getLogger("poller.deliver.nats")


async def _ignore(*_: Any) -> None:
    """nats-py's callbacks: its errors reach us as the publish's own."""


class _Link(NamedTuple):
    """A connection and its JetStream context, made once (nats-py's ``jetstream()``
    builds a new one a call)."""

    client: Client
    js: JetStreamContext


class NatsSender(BrokerSender[_Link]):
    """JetStream publishes, a connection per destination (poller/deliver/broker_links.py);
    ``retry_span``: how long a resend must be recognised (the retry schedule's span)."""

    kind = "nats"

    def __init__(self, *, retry_span: float = 0.0, **options: Any) -> None:
        super().__init__(**options)
        self._retry_span = retry_span
        self._windows_checked: set[str] = set()

    async def _open(
        self, destination: Destination, address: str, budget: float, tls: TLSSettings | None
    ) -> _Link:
        host = destination.host if destination.tls else address
        server = f"{'tls' if destination.tls else 'nats'}://{_bracketed(host)}:{destination.port}"
        options: dict[str, Any] = {}
        if destination.tls:
            options["tls"] = ssl.create_default_context() if tls is None else tls.context()
            options["tls_hostname"] = destination.host
        if destination.username is not None and destination.password is None:
            options["token"] = destination.username  # nats://TOKEN@host
        elif destination.username is not None:
            options["user"], options["password"] = destination.username, destination.password
        client = await nats.connect(
            servers=[server],
            connect_timeout=budget,
            allow_reconnect=False,  # broker_links reconnects, bounded and counted
            max_reconnect_attempts=0,
            error_cb=_ignore,
            disconnected_cb=_ignore,
            closed_cb=_ignore,
            name="webhook-poller",
            **options,
        )
        return _Link(client, client.jetstream())

    async def _close(self, link: _Link) -> None:
        await link.client.close()

    def _usable(self, link: _Link) -> bool:
        return bool(link.client.is_connected)

    async def _publish(
        self,
        link: _Link,
        destination: Destination,
        headers: Mapping[str, str],
        body: bytes,
        left: float,
        timeout: float,
    ) -> Reply:
        message_headers = {**headers, MSG_ID: headers["webhook-id"]}
        try:
            ack = await link.js.publish(
                destination.subject, body, timeout=left, headers=message_headers
            )
        except nats.js.errors.NoStreamResponseError:
            raise SendError(
                "NoStream", f"no JetStream stream takes subject {destination.subject!r}", sent=False
            ) from None
        except nats.js.errors.APIError as exc:
            raise SendError(
                "BrokerRefused", f"JetStream refused the message: {exc.description}", sent=False
            ) from None
        except (nats.errors.MaxPayloadError, nats.errors.OutboundBufferLimitError) as exc:
            # refused by the client before a byte was written: known not sent
            raise SendError("BrokerRefused", f"{exc} ({len(body):,} bytes)", sent=False) from None
        except (TimeoutError, nats.errors.TimeoutError):
            raise SendError(
                "PublishTimeout", f"no PubAck within {timeout:g}s: maybe stored", sent=True
            ) from None
        except nats.errors.Error as exc:  # closed, stale, draining: after the publish began
            raise LinkLost(SendError("ConnectionLost", error_text(exc), sent=True)) from None
        if ack.stream not in self._windows_checked:
            self._windows_checked.add(ack.stream)
            await self._check_window(link.js, ack.stream)
        stream, duplicate = json.dumps(ack.stream), "true" if ack.duplicate else "false"
        answer = f'{{"stream": {stream}, "seq": {ack.seq}, "duplicate": {duplicate}}}'
        return Reply(200, None, answer.encode())

    async def _check_window(self, js: JetStreamContext, stream: str) -> None:
        """Say once, at a stream's first PubAck, when its duplicate window is shorter than
        the retry schedule: a resend after an unknown outcome past it is stored again."""
        try:
            info = await js.stream_info(stream)
        except (nats.errors.Error, TimeoutError):
            return  # a courtesy: the next poller start asks again
        window = info.config.duplicate_window or 0.0
        if window < self._retry_span:
            log.warning(
                "JetStream stream %s drops a resend within %g s (its duplicate_window), but "
                "the retry schedule runs %g s: a resend after an unknown outcome past the "
                "window is stored again (consumers dedupe on Nats-Msg-Id); "
                "docs/how-to/brokers.md",
                stream,
                window,
                self._retry_span,
            )


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host
