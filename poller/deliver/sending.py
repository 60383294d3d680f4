"""The senders, and the one the settings ask for (``POLLER_HTTP_CLIENT``, whose default
poller/settings.py names), routed by the URL's scheme to a broker's.

Every sender implements the one seam, poller/deliver/wire.py (``Sender``: what it
takes, answers and raises, and the budgets); each is beside it, named for its client:
poller/deliver/reqwest_sender.py (pyreqwest), poller/deliver/aiohttp_sender.py and
poller/deliver/httpx_sender.py for HTTP; poller/deliver/nats_sender.py (nats-py),
poller/deliver/amqp_sender.py (aio-pika) and poller/deliver/redis_sender.py (redis-py)
for the brokers an endpoint's URL may name (poller/rules/destinations.py). A sender's
module is imported only when it is asked for: httpx's, with its command line, was 0.1 s
of every ``poller run``'s start, and a broker's client is an extra an HTTP-only
service does not install. The figures behind the default are in
docs/explanation/performance.md.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any

from poller.deliver.wire import Reply, Sender
from poller.errors import SendError
from poller.rules.destinations import BROKER_SCHEMES

if TYPE_CHECKING:
    from poller.endpoints.tls import TLSSettings
    from poller.settings import Settings

SENDERS = {
    "aiohttp": ("poller.deliver.aiohttp_sender", "AiohttpSender"),
    "httpx": ("poller.deliver.httpx_sender", "HttpxSender"),
    "reqwest": ("poller.deliver.reqwest_sender", "ReqwestSender"),
}
"""``POLLER_HTTP_CLIENT`` → the module and class of its sender."""

BROKERS = {
    "nats": ("poller.deliver.nats_sender", "NatsSender", "nats-py", "nats"),
    "amqp": ("poller.deliver.amqp_sender", "AmqpSender", "aio-pika", "rabbitmq"),
    "redis": ("poller.deliver.redis_sender", "RedisSender", "redis", "server"),
}
"""A broker → the module and class of its sender, its client and the extra that brings it."""


class Routes:
    """The one sender the service holds: http(s) URLs to the HTTP sender, a broker's to
    its own, made on the first message for that broker."""

    def __init__(self, http: Sender, options: Mapping[str, Any]) -> None:
        self._http = http
        self._options = options
        self._brokers: dict[str, Sender] = {}

    def request(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        body: bytes,
        timeout: float,
        tls: TLSSettings | None = None,
    ) -> Coroutine[Any, Any, Reply]:
        """The routed sender's ``request`` (the seam's), handed back to be awaited: no
        coroutine of its own between the caller and the sender."""
        if url[:4].lower() == "http":  # http(s):// in any case; no broker's scheme starts so
            return self._http.request(method, url, headers, body, timeout, tls)
        sender = self._broker(url.partition("://")[0].lower())
        return sender.request(method, url, headers, body, timeout, tls)

    def _broker(self, scheme: str) -> Sender:
        if scheme not in BROKER_SCHEMES:
            raise SendError("InvalidURL", f"no sender for scheme {scheme!r}", sent=False)
        kind = BROKER_SCHEMES[scheme][0]
        sender = self._brokers.get(kind)
        if sender is None:
            module, name, client, extra = BROKERS[kind]
            try:
                made: Callable[..., Sender] = getattr(importlib.import_module(module), name)
            except ImportError:
                raise SendError(
                    "NotInstalled",
                    f"{client} is not installed: pip install 'webhook-poller[{extra}]'",
                    sent=False,
                ) from None
            sender = self._brokers[kind] = made(**self._options)
        return sender

    async def aclose(self) -> None:
        for sender in (self._http, *self._brokers.values()):
            await sender.aclose()


def make_sender(settings: Settings) -> Sender:
    """The shared sender for deliveries and lookups, as the settings ask: HTTP by
    ``POLLER_HTTP_CLIENT``, brokers by the URL (:class:`Routes`)."""
    module, name = SENDERS[settings.http_client]
    sender: Callable[..., Sender] = getattr(importlib.import_module(module), name)
    options = {
        # connections for the deliveries at work and those waiting for slow receivers
        "limit": settings.concurrency + settings.max_waiting,
        "allow_private": settings.allow_private_targets,
        "connect_timeout": settings.connect_timeout,
    }
    brokers = {**options, "retry_span": retry_span(settings.retry_schedule, settings.max_attempts)}
    return Routes(sender(**options, proxy=settings.proxy), brokers)


def retry_span(schedule: tuple[float, ...], attempts: int) -> float:
    """Seconds from a message's first attempt to its last on this schedule (no jitter):
    how long a broker must recognise a resend (JetStream's duplicate window)."""
    return float(sum(schedule[min(i, len(schedule) - 1)] for i in range(attempts - 1)))
