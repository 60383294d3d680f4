"""How often a poller makes the governed claim (poller/claimer.py ``_govern_every``)."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

from poller.claimer import Claimer
from poller.dispatcher import EndpointCache
from poller.endpoints import Endpoint
from poller.health import GOVERN_IDLE_INTERVAL, GOVERN_INTERVAL, GOVERN_QUIET
from poller.settings import load_settings


def _claimer(endpoints: EndpointCache, failed_at: float) -> Claimer:
    dispatcher: Any = SimpleNamespace(failed_at=failed_at)
    return Claimer(load_settings(), Any, dispatcher, Any, endpoints, scope=Any)  # type: ignore[arg-type]


def _endpoint(rate_limit: float | None) -> Endpoint:
    now = datetime.now(UTC)
    return Endpoint(
        1, "a", "http://127.0.0.1:9/", None, True, None, None, None, None, 0, now, now, "s",
        rate_limit=rate_limit,
    )  # fmt: skip


def test_a_quiet_poller_governs_once_a_second_and_often_when_there_may_be_work() -> None:
    now = time.monotonic()
    endpoints = EndpointCache()
    quiet = _claimer(endpoints, failed_at=now - GOVERN_QUIET - 1)
    assert quiet._govern_every(now) == GOVERN_IDLE_INTERVAL
    quiet._governed_busy = True  # its last governed claim found work
    assert quiet._govern_every(now) == GOVERN_INTERVAL
    failing = _claimer(endpoints, failed_at=now - 1)  # a circuit may open
    assert failing._govern_every(now) == GOVERN_INTERVAL
    endpoints.update([_endpoint(rate_limit=5.0)])  # a rate-limited endpoint is known
    assert quiet._govern_every(now) == GOVERN_INTERVAL
    quiet._governed_busy = False
    assert quiet._govern_every(now) == GOVERN_INTERVAL
    endpoints.update([_endpoint(rate_limit=None)])  # its limit was removed
    assert quiet._govern_every(now) == GOVERN_IDLE_INTERVAL
