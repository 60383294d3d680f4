"""How often a poller makes the governed claim (poller/claim/claimer.py ``_govern_every``)."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

from poller.claim.claimer import Claimer
from poller.claim.shards import ClaimScope
from poller.deliver.dispatcher import EndpointCache
from poller.endpoints.registry import Endpoint
from poller.rules.health import GOVERN_IDLE_INTERVAL, GOVERN_INTERVAL, GOVERN_QUIET
from poller.settings import load_settings


def _claimer(endpoints: EndpointCache, failed_at: float) -> Claimer:
    dispatcher: Any = SimpleNamespace(failed_at=failed_at)
    scope = lambda: ClaimScope(None, None, 1, maintenance=True)  # noqa: E731  (every bucket)
    claimer = Claimer(load_settings(), Any, dispatcher, Any, endpoints, scope=scope)  # type: ignore[arg-type]
    claimer._limited_seen = claimer._limited_notes  # as after its first governed claim
    return claimer


def _endpoint(rate_limit: float | None, bucket: int = 0) -> Endpoint:
    now = datetime.now(UTC)
    return Endpoint(
        1, "a", "http://127.0.0.1:9/", None, True, None, None, None, None, bucket, now, now,
        "s", rate_limit=rate_limit,
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
    assert quiet._govern_every(now) == GOVERN_INTERVAL  # no NOTIFY to say when it has one
    endpoints.update([_endpoint(rate_limit=None)])  # its limit was removed
    assert quiet._govern_every(now) == GOVERN_IDLE_INTERVAL


def test_a_listening_poller_governs_often_only_after_a_notify_for_a_rate_limited_bucket() -> None:
    """With LISTEN on, a known rate-limited endpoint alone no longer makes the governed
    claim come ten times a second: a busy poller walked every idle rate-limited
    endpoint that often, with nothing to take. A NOTIFY for its bucket does, until the
    next governed claim has begun."""
    now = time.monotonic()
    endpoints = EndpointCache()
    endpoints.update([_endpoint(rate_limit=5.0, bucket=7)])
    claimer = _claimer(endpoints, failed_at=now - GOVERN_QUIET - 1)
    claimer.listening = True
    assert claimer._govern_every(now) == GOVERN_IDLE_INTERVAL
    assert claimer._idle_for() == claimer.settings.poll_interval
    claimer._notified("8")  # another bucket's message
    assert claimer._govern_every(now) == GOVERN_IDLE_INTERVAL
    claimer._notified("7")
    assert claimer._govern_every(now) == GOVERN_INTERVAL
    assert claimer._idle_for() <= GOVERN_INTERVAL
    claimer._limited_seen = claimer._limited_notes  # a governed claim began after it
    assert claimer._govern_every(now) == GOVERN_IDLE_INTERVAL
    endpoints.update([_endpoint(rate_limit=None, bucket=7)])  # its limit was removed
    claimer._notified("7")
    assert claimer._govern_every(now) == GOVERN_IDLE_INTERVAL


def test_what_comes_due_after_a_rate_limited_message_brings_the_governed_claim() -> None:
    """A rate-limited endpoint's next message that no NOTIFY announces — its key's next
    once it has ended, itself handed back — makes the governed claim come soon, and
    only for messages a governed claim took for such an endpoint."""
    now = time.monotonic()
    endpoints = EndpointCache()
    endpoints.update([_endpoint(rate_limit=5.0)])
    claimer = _claimer(endpoints, failed_at=now - GOVERN_QUIET - 1)
    claimer.listening = True
    claimer._limited_out = {1: True, 2: False, 3: False, 4: True}  # 1 and 4 are ordered

    def seen() -> None:  # a governed claim began
        claimer._limited_seen = claimer._limited_notes

    def ended(msg_id: int, status: str, retry_delay: float | None = None) -> Any:
        return SimpleNamespace(message_id=msg_id, status=status, retry_delay=retry_delay)

    claimer.written([ended(2, "delivered"), ended(9, "pending")])  # unordered; not ours
    claimer.written([ended(4, "pending", retry_delay=5.0)])  # its key waits for its retry
    assert claimer._govern_every(now) == GOVERN_IDLE_INTERVAL
    claimer.written([ended(1, "delivered")])  # its key's next is due
    assert claimer._govern_every(now) == GOVERN_INTERVAL
    seen()
    claimer.written([ended(3, "pending")])  # handed back
    assert claimer._govern_every(now) == GOVERN_INTERVAL
    assert claimer._limited_out == {}
