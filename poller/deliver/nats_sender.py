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
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client

from poller.deliver.broker_links import Links, destination_of
from poller.deliver.wire import Reply, connect_budget, error_text
from poller.endpoints.netguard import Resolve, system_resolve
from poller.errors import SendError
from poller.rules.destinations import Destination

if TYPE_CHECKING:
    from poller.endpoints.tls import TLSSettings

MSG_ID = "Nats-Msg-Id"
log = logging.getLogger("poller.deliver.nats")


async def _ignore(*_: Any) -> None:
    """nats-py's callbacks: its errors reach us as the publish's own."""


class NatsSender:
    """JetStream publishes, a connection per destination (poller/deliver/broker_links.py)."""

    def __init__(
        self,
        *,
        allow_private: bool = False,
        connect_timeout: float = 5.0,
        resolve: Resolve = system_resolve,
        retry_span: float = 0.0,
        **_: Any,
    ) -> None:
        self._connect_timeout = connect_timeout
        self._links: Links[Client] = Links(
            "nats", self._open, self._close, allow_private=allow_private, resolve=resolve
        )
        self._retry_span = retry_span
        self._windows_checked: set[str] = set()

    @staticmethod
    async def _open(
        destination: Destination, address: str, budget: float, tls: TLSSettings | None
    ) -> Client:
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
        return await nats.connect(
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

    @staticmethod
    async def _close(client: Client) -> None:
        await client.close()

    async def request(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        body: bytes,
        timeout: float,
        tls: TLSSettings | None = None,
    ) -> Reply:
        if method != "POST":
            raise SendError("NotSupported", "a NATS destination has no lookup", sent=False)
        destination = destination_of(url)
        began = time.monotonic()
        budget = connect_budget(self._connect_timeout, timeout)
        client = await self._links.get(url, destination, budget, tls)
        if not client.is_connected:  # closed since it was kept: open another, once
            await self._links.drop(url, tls, client)
            client = await self._links.get(url, destination, budget, tls)
        left = max(timeout - (time.monotonic() - began), 0.001)
        message_headers = {**headers, MSG_ID: headers["webhook-id"]}
        try:
            ack = await client.jetstream().publish(
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
        except (TimeoutError, nats.errors.TimeoutError):
            raise SendError(
                "PublishTimeout", f"no PubAck within {timeout:g}s: maybe stored", sent=True
            ) from None
        except nats.errors.Error as exc:  # closed, stale, draining: after the publish began
            await self._links.drop(url, tls, client)
            raise SendError("ConnectionLost", error_text(exc), sent=True) from None
        if ack.stream not in self._windows_checked:
            self._windows_checked.add(ack.stream)
            await self._check_window(client, ack.stream)
        answer = {"stream": ack.stream, "seq": ack.seq, "duplicate": bool(ack.duplicate)}
        return Reply(200, None, json.dumps(answer).encode())

    async def _check_window(self, client: Client, stream: str) -> None:
        """Say once, at a stream's first PubAck, when its duplicate window is shorter than
        the retry schedule: a resend after an unknown outcome past it is stored again."""
        try:
            info = await client.jetstream().stream_info(stream)
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

    async def aclose(self) -> None:
        await self._links.aclose()


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host
