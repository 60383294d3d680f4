"""Every sender the poller ships, by name, for the tests that must hold for each."""

from __future__ import annotations

from typing import Any

from poller.deliver.aiohttp_sender import AiohttpSender
from poller.deliver.httpx_sender import HttpxSender
from poller.deliver.reqwest_sender import ReqwestSender
from poller.deliver.wire import Sender

KINDS = ("aiohttp", "httpx", "reqwest")


def make(kind: str, **options: Any) -> Sender:
    """The sender called ``kind`` with ``options`` (its constructor's keywords)."""
    cls = {"aiohttp": AiohttpSender, "httpx": HttpxSender, "reqwest": ReqwestSender}[kind]
    return cls(**options)  # type: ignore[no-any-return]
