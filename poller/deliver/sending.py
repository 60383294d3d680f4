"""The senders, and the one the settings ask for (``POLLER_HTTP_CLIENT``, whose default
poller/settings.py names).

Every sender implements the one seam, poller/deliver/wire.py (``Sender``: what it
takes, answers and raises, and the budgets); each is beside it, named for its client:
poller/deliver/reqwest_sender.py (pyreqwest), poller/deliver/aiohttp_sender.py and
poller/deliver/httpx_sender.py. A sender's module is imported only when it is asked
for: httpx's, with its command line, was 0.1 s of every ``poller run``'s start. The
figures behind the default are in docs/explanation/performance.md.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from poller.deliver.wire import Sender
    from poller.settings import Settings

SENDERS = {
    "aiohttp": ("poller.deliver.aiohttp_sender", "AiohttpSender"),
    "httpx": ("poller.deliver.httpx_sender", "HttpxSender"),
    "reqwest": ("poller.deliver.reqwest_sender", "ReqwestSender"),
}
"""``POLLER_HTTP_CLIENT`` → the module and class of its sender."""


def make_sender(settings: Settings) -> Sender:
    """The shared HTTP sender for deliveries and lookups, as the settings ask."""
    module, name = SENDERS[settings.http_client]
    sender: Callable[..., Sender] = getattr(importlib.import_module(module), name)
    # connections for the deliveries at work and those waiting for slow receivers
    return sender(
        limit=settings.concurrency + settings.max_waiting,
        allow_private=settings.allow_private_targets,
        connect_timeout=settings.connect_timeout,
        proxy=settings.proxy,
    )
