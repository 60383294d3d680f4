"""The sender the settings ask for (``POLLER_HTTP_CLIENT``): aiohttp, httpx or reqwest.

The senders are in poller/senders.py (aiohttp), poller/httpx_sender.py and
poller/reqwest_sender.py; what they share, and the seam, in poller/wire.py. httpx is
imported only when it is asked for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from poller.reqwest_sender import ReqwestSender
from poller.senders import AiohttpSender
from poller.wire import Sender

if TYPE_CHECKING:
    from poller.settings import Settings


def make_sender(settings: Settings) -> Sender:
    """The shared HTTP sender for deliveries and lookups, as the settings ask."""
    # connections for the deliveries at work and those waiting for slow receivers
    limit = settings.concurrency + settings.max_waiting
    allow = settings.allow_private_targets
    proxy, connect = settings.proxy, settings.connect_timeout
    if settings.http_client == "aiohttp":
        return AiohttpSender(limit=limit, allow_private=allow, connect_timeout=connect, proxy=proxy)
    if settings.http_client == "httpx":
        from poller.httpx_sender import HttpxSender

        return HttpxSender(limit=limit, allow_private=allow, connect_timeout=connect, proxy=proxy)
    return ReqwestSender(limit=limit, allow_private=allow, connect_timeout=connect, proxy=proxy)
