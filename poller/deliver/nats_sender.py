"""Publishing to NATS JetStream (``nats://host:port/SUBJECT``, ``nats+tls://``) with nats-py,
behind the one seam (poller/deliver/wire.py); poller/deliver/sending.py routes a broker
URL here.

*Delivered* is JetStream's PubAck: the stream stored the message. The message carries
the request's headers — ``webhook-id``, ``webhook-timestamp``, ``webhook-signature``,
``traceparent``, the ordering key and sequence — and ``Nats-Msg-Id`` = ``webhook-id``,
on which JetStream drops a second copy within the stream's duplicate window
(``duplicate_window``, 2 minutes by default): a resend after an *unknown* outcome is
acknowledged ``duplicate`` instead of stored twice. Past the window a resend is stored
again, and a consumer dedupes on ``Nats-Msg-Id`` (docs/how-to/nats.md says how long
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

**PubAcks come to one subscription a connection.** nats-py's ``js.publish`` is a
request: a random inbox token (a ``getrandom`` call), a future and ``wait_for``'s
second future and timer, then a dataclass built from the answer — about 30 µs of its
70–80 per publish here. The sender publishes with a reply subject of its own
(``_INBOX.<nuid>.<n>``) through nats-py's ``publish`` and takes the answers on one
wildcard subscription, with one timer for all their deadlines; it reads the PubAck JSON itself
(the fields JetStream documents: ``stream``, ``seq``, ``duplicate``, ``error``). A 503
status answer is JetStream's "no stream takes this subject". A connection lost while
publishes wait answers each of them at once as *unknown* instead of at its timeout.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import math
import ssl
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

import nats
import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from poller.deliver.broker_links import BrokerSender, LinkLost
from poller.deliver.wire import Reply, error_text
from poller.errors import SendError
from poller.rules.destinations import Destination

if TYPE_CHECKING:
    from poller.endpoints.tls import TLSSettings

MSG_ID = "Nats-Msg-Id"
STATUS, NO_RESPONDERS = "Status", "503"  # the server's answer when nothing listens
log = logging.getLogger("poller.deliver.nats")
_decode = json.JSONDecoder().raw_decode
CLOCK_SLACK = 0.001  # the loop's timers fire up to a millisecond early: then is due


async def _ignore(*_: Any) -> None:
    """nats-py's callbacks: its errors reach us as the publish's own."""


class _Acks:
    """The answers to one connection's publishes: a reply subject and a future each,
    resolved by one wildcard subscription; one timer for all their deadlines.

    A timer a publish (``call_later`` and its cancel) cost more than the rest of the
    waiting together. The one timer is set for the earliest deadline of the publishes
    still unanswered; when it fires it fails those past theirs and is set for the next.
    Answered publishes leave the table at once, so it holds only those in flight."""

    def __init__(self) -> None:
        self.prefix = ""
        self._loop = asyncio.get_running_loop()
        self._waiting: dict[str, tuple[asyncio.Future[Msg], float]] = {}
        self._numbers = itertools.count()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf

    async def listen(self, client: Client) -> None:
        self.prefix = client.new_inbox() + "."
        await client.subscribe(self.prefix + "*", cb=self._answered)

    async def _answered(self, msg: Msg) -> None:
        waiting = self._waiting.pop(msg.subject, None)
        if waiting is not None and not waiting[0].done():
            waiting[0].set_result(msg)

    def expect(self, within: float) -> tuple[str, asyncio.Future[Msg]]:
        """A reply subject and the future its answer resolves, or TimeoutError after
        ``within`` seconds."""
        reply = f"{self.prefix}{next(self._numbers)}"
        loop = self._loop
        future = loop.create_future()
        deadline = loop.time() + within
        self._waiting[reply] = (future, deadline)
        if deadline < self._timer_at:
            self._arm(deadline)
        return reply, future

    def forget(self, reply: str, answer: asyncio.Future[Msg]) -> None:
        """The publish is over, however it ended: its entry goes, and its future is
        cancelled, or its expiry marked seen when nobody awaited it (a publish that failed
        after its deadline), so asyncio never reports an exception nobody retrieved."""
        self._waiting.pop(reply, None)
        if not answer.done():
            answer.cancel()
        elif not answer.cancelled():
            answer.exception()

    def _arm(self, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_at = self._loop.call_at(at, self._expire), at

    def _expire(self) -> None:
        self._timer, self._timer_at = None, math.inf
        now = self._loop.time() + CLOCK_SLACK
        gone = [reply for reply, (_, deadline) in self._waiting.items() if deadline <= now]
        for reply in gone:
            future = self._waiting.pop(reply)[0]
            if not future.done():
                future.set_exception(TimeoutError())
        if self._waiting:
            self._arm(min(deadline for _, deadline in self._waiting.values()))

    async def lost(self) -> None:
        """The connection is gone (nats-py's disconnected callback): no answer will come."""
        waiting, self._waiting = self._waiting, {}
        if self._timer is not None:
            self._timer.cancel()
            self._timer, self._timer_at = None, math.inf
        for future, _ in waiting.values():
            if not future.done():
                future.set_exception(nats.errors.ConnectionClosedError())


class _Link(NamedTuple):
    """A connection, its JetStream context (for a stream's settings) and its answers."""

    client: Client
    js: JetStreamContext
    acks: _Acks


class NatsSender(BrokerSender[_Link]):
    """JetStream publishes, a connection per destination (poller/deliver/broker_links.py);
    ``retry_span``: how long a resend must be recognised (the retry schedule's span)."""

    kind = "nats"

    def __init__(self, *, retry_span: float = 0.0, **options: Any) -> None:
        super().__init__(**options)
        self._retry_span = retry_span
        self._streams: dict[str, str] = {}  # a stream's name → as JSON (its window checked)

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
        acks = _Acks()
        client = await nats.connect(
            servers=[server],
            connect_timeout=budget,
            allow_reconnect=False,  # broker_links reconnects, bounded and counted
            max_reconnect_attempts=0,
            error_cb=_ignore,
            disconnected_cb=acks.lost,
            closed_cb=_ignore,
            name="webhook-poller",
            **options,
        )
        try:
            await acks.listen(client)
        except BaseException:
            await client.close()
            raise
        return _Link(client, client.jetstream(), acks)

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
        reply, answer = link.acks.expect(left)
        try:
            try:
                await link.client.publish(
                    destination.subject, body, reply=reply, headers=message_headers
                )
            except (nats.errors.MaxPayloadError, nats.errors.OutboundBufferLimitError) as exc:
                # refused by the client before a byte was written: known not sent
                raise SendError(
                    "BrokerRefused", f"{exc} ({len(body):,} bytes)", sent=False
                ) from None
            except nats.errors.Error as exc:  # closed, stale, draining: maybe written
                raise LinkLost(SendError("ConnectionLost", error_text(exc), sent=True)) from None
            try:
                msg = await answer
            except TimeoutError:
                raise SendError(
                    "PublishTimeout", f"no PubAck within {timeout:g}s: maybe stored", sent=True
                ) from None
            except nats.errors.Error as exc:  # the connection was lost after the publish
                raise LinkLost(SendError("ConnectionLost", error_text(exc), sent=True)) from None
        finally:  # whatever ended it, a cancellation or a crash included
            link.acks.forget(reply, answer)
        if msg.headers and msg.headers.get(STATUS) == NO_RESPONDERS:
            raise SendError(
                "NoStream", f"no JetStream stream takes subject {destination.subject!r}", sent=False
            )
        stream, seq, duplicate = _pub_ack(msg.data)
        quoted = self._streams.get(stream)
        if quoted is None:
            quoted = self._streams[stream] = json.dumps(stream)
            await self._check_window(link.js, stream)
        said = f'{{"stream": {quoted}, "seq": {seq}, "duplicate": {duplicate}}}'
        return Reply(200, None, said.encode())

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
                "docs/how-to/nats.md",
                stream,
                window,
                self._retry_span,
            )


def _pub_ack(data: bytes) -> tuple[str, int, str]:
    """A PubAck's stream, sequence and ``duplicate`` (as JSON); SendError for JetStream's
    refusal, or for an answer that is no PubAck: something else than JetStream answered
    on the subject (a core NATS responder), which may have had the message, unstored."""
    try:  # json.loads(bytes) spent half its time guessing the encoding JetStream states
        ack = _decode(data.decode())[0]
    except ValueError:  # UnicodeDecodeError too
        ack = None
    if isinstance(ack, dict) and isinstance(error := ack.get("error"), dict):
        said = error.get("description", error)
        raise SendError("BrokerRefused", f"JetStream refused the message: {said}", sent=False)
    if (
        not isinstance(ack, dict)
        or not isinstance(stream := ack.get("stream"), str)
        or type(seq := ack.get("seq")) is not int
    ):
        raise SendError(
            "NotJetStream", f"the answer is not a JetStream PubAck: {data[:80]!r}", sent=True
        )
    return stream, seq, "true" if ack.get("duplicate") is True else "false"


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host
