"""Endpoint health: circuit breaker, rate limits, pauses and auto-disable, shared by every poller.

All of it lives in PostgreSQL (``poller_endpoint_health``, one row per endpoint,
and ``poller_endpoints.paused_until``), so every poller agrees on it and a
restart forgets nothing.

Circuit breaker
---------------
::

                N failed sends in a row                 cool-down passed and a
    ┌────────┐ ────────────────────────▶ ┌──────┐ ── message due: it goes ──▶ ┌───────────┐
    │ closed │                           │ open │    alone, the probe         │ half_open │
    └────────┘ ◀── a delivery (one in ── └──────┘ ◀── the probe failed: ───── └───────────┘
        ▲           flight when it opened)           cool-down doubled, capped      │
        └────────────────────── the probe (or any send) was delivered ──────────────┘

* **Closed**: messages are claimed as usual. Each completion batch tells the
  endpoint's row what its sends did (JUDGE_HEALTH): a delivery resets the
  count of consecutive failed sends; a failed send — no answer, a 5xx, 408 or
  429 — adds one. Another 4xx counts neither way: the receiver is up and
  refusing that message. ``circuit_failures`` in a row (the endpoint's, else
  ``POLLER_CIRCUIT_FAILURES``, default 10; 0 turns the breaker off) open it.
* **Open**: the claim statement skips the endpoint (``paused_until`` is
  ``CIRCUIT_HOLD``, the year 9000). Its messages wait **without spending attempts**; nothing is
  sent. Messages already in flight when it opened finish as they do.
* After the cool-down (the endpoint's ``circuit_cooldown``, else
  ``POLLER_CIRCUIT_COOLDOWN``, default 30 s) the next governed claim that finds
  one of its messages due takes that one alone — the **probe** — and marks the
  circuit half-open. A probe that ends with neither a delivery nor a failed
  request — handed back unsent by a graceful shutdown, answered with a 4xx
  that is not a failure (the receiver is up, refusing that message), expired
  (older than ``max_age``), reclaimed after its poller died — is followed by
  the next probe as soon as no message of the endpoint is in flight; one that
  stays in flight, after two claim leases. Messages at the head of the backlog
  already past the endpoint's ``max_age`` (that need no lookup) are taken a
  claim's worth at a time and failed unsent, the probe with them.
* **Half-open**: a delivered probe closes the circuit; the backlog then drains
  at the endpoint's ``max_in_flight`` and rate limit. A failed probe opens it
  again for twice the cool-down, up to ``POLLER_CIRCUIT_COOLDOWN_MAX`` (default
  15 min). **A failed probe's attempt is handed back**, up to
  :data:`~poller.rules.outcomes.MAX_PROBE_REFUNDS` times per message (then it is
  charged like any attempt): while an endpoint is down its messages do not age
  out, and the endpoint's health decides instead (auto-disable, below). A
  probe's lookup (its message's earlier send had no answer) is a probe too.

Every failed request counts — a send or a lookup with no answer, a 5xx, 408 or
429 — whatever the message's attempt budget: with ``max_attempts`` 1 each
message fails for good on its one send, and that send still counts towards
opening the circuit, its cool-down and auto-disable.

Rate limits
-----------
An endpoint's ``rate_limit`` (requests per second, with ``rate_burst``, default
one second's worth) is a token bucket in its health row. Its messages are not
claimed by the plain claim statement but by ``CLAIM_GOVERNED``, which takes
the messages under the health row's lock (SKIP LOCKED), and ``SPEND_TOKENS``, which
spends their tokens on that locked row in the same transaction: every poller
draws on the same bucket, whatever the election mode, with no round trip per
message. Each poller runs it at most ten times a second while there may
be governed work (``GOVERN_INTERVAL``), else once a second (``GOVERN_IDLE_INTERVAL``).
Messages at the head already past the endpoint's ``max_age`` (that need no lookup)
take no token: they are claimed a claim's worth at a time and failed unsent, as
behind an open circuit. Each took a token once: a backlog larger than the rate
times ``max_age`` failed at the rate, the messages behind it aged out while they
waited, and while messages kept coming at the rate none was sent.

A ``429`` or ``503`` with a valid ``Retry-After`` pauses the **whole
endpoint** until then (capped by ``POLLER_RETRY_AFTER_MAX``), not only that
message: ``paused_until`` makes every poller skip it.

Auto-disable
------------
An endpoint whose sends have failed for ``POLLER_DISABLE_AFTER`` (default 5
days; 0: never) without a single delivery is disabled, the reason stored
(``failing since … with no success``). Its messages stay ``pending`` and wait,
spending nothing; ``admin stats`` counts them, the
``webhook_poller_endpoint_disabled_pending`` gauge shows them, and
``WebhookPollerEndpointDisabled`` alerts. ``poller endpoints enable NAME``
closes the circuit and the backlog drains.

Operational events
------------------
Transitions are reported as :class:`OperationalEvent` — to in-process hooks
and, with ``POLLER_OPERATOR_ENDPOINT``, as signed webhooks to that endpoint,
enqueued in the same transaction as the change (poller/rows/events.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from poller.errors import InvalidEndpoint


@dataclass(frozen=True, slots=True)
class HealthPolicy:
    """The global settings of the breaker and auto-disable (``POLLER_CIRCUIT_*``, ...)."""

    circuit_failures: int = 10  # failed sends in a row that open a circuit; 0: never
    circuit_cooldown: float = 30.0  # seconds open before the first probe
    circuit_cooldown_max: float = 900.0  # each failed probe doubles the cool-down, up to this
    disable_after: float = 5 * 86400.0  # failing this long with no delivery: disable; 0: never

    def params(self) -> dict[str, float]:
        return {
            "circuit_failures": self.circuit_failures,
            "circuit_cooldown": self.circuit_cooldown,
            "circuit_cooldown_max": self.circuit_cooldown_max,
            "disable_after": self.disable_after,
        }


ENDPOINT_FAILURE_STATUSES = frozenset({408, 429})


FAILED_REQUEST_OUTCOMES = frozenset(
    {"retry", "unknown", "failed", "probe_failed", "lookup_retry", "lookup_failed"}
)


def is_endpoint_failure(status_code: int | None, outcome: str) -> bool:
    """A failed request that counts against the endpoint: a send or a lookup that got no
    answer, a 5xx, 408 or 429 — whatever the message's attempt budget, probes included
    (poller/rows/judging.py ``health_signals`` counts them for JUDGE_HEALTH)."""
    if outcome not in FAILED_REQUEST_OUTCOMES:
        return False
    return status_code is None or status_code >= 500 or status_code in ENDPOINT_FAILURE_STATUSES


GOVERN_INTERVAL = 0.1
"""Seconds between two governed claims of one poller while there may be governed work:
its last governed claim found some, a NOTIFY came for the bucket of a rate-limited
endpoint it knows since (or, without NOTIFY, it knows one), or one of its requests
failed in the last :data:`GOVERN_QUIET` seconds (a circuit may open)."""
GOVERN_IDLE_INTERVAL = 1.0
"""Seconds between two governed claims otherwise. A poller whose endpoints are all
healthy and unlimited then claims with one statement, not two: at 100 messages/s the
governed claim ran before nearly every plain one and was a third of commit→receipt
(docs/explanation/performance.md). What it costs: a circuit another poller opened is
probed up to a second later, a rate-limited endpoint this poller has never claimed
for waits up to a second for its first governed claim, and so does a retry due
more than GOVERN_QUIET seconds after its failure; what comes due now after the
messages this poller took (a key's next, a hand-back), it knows
(``Claimer.written``)."""
GOVERN_QUIET = 30.0
"""Seconds after a poller's last failed request during which it keeps governing often."""


class _Default:
    """Give as a health setting to :func:`update_endpoint` to go back to the default."""

    def __repr__(self) -> str:
        return "DEFAULT"


DEFAULT: Any = _Default()
MAX_RATE = 1_000_000.0
MIN_COOLDOWN = 0.05  # seconds (POLLER_CIRCUIT_COOLDOWN's floor too): each failed probe
# doubles it, so 5e-324 meant a failing endpoint probed ten times a second for minutes
MIN_RATE = 0.00001  # requests a second: about one a day. Below it the token bucket's
# arithmetic in PostgreSQL underflows (5e-324 × seconds is 0: "value out of range") and
# every claim of rate-limited endpoints failed.


def check_health_settings(
    rate_limit: Any, rate_burst: Any, circuit_failures: Any, circuit_cooldown: Any
) -> dict[str, Any]:
    """An endpoint's given health settings, checked (``DEFAULT`` becomes NULL; None is left out)."""
    checked: dict[str, Any] = {}
    for name, value in (
        ("rate_limit", rate_limit),
        ("rate_burst", rate_burst),
        ("circuit_failures", circuit_failures),
        ("circuit_cooldown", circuit_cooldown),
    ):
        if value is None:
            continue
        if value is DEFAULT:
            checked[name] = None
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InvalidEndpoint(f"{name} must be a number")
        if name == "rate_limit" and not (math.isfinite(value) and MIN_RATE <= value <= MAX_RATE):
            raise InvalidEndpoint(
                f"rate_limit must be from {MIN_RATE:g} (about one a day) to {MAX_RATE:g} per second"
            )
        if name == "rate_burst" and (not isinstance(value, int) or not 1 <= value <= 1_000_000):
            raise InvalidEndpoint("rate_burst must be a whole number from 1 to 1000000")
        if name == "circuit_failures" and (
            not isinstance(value, int) or not 0 <= value <= 1_000_000
        ):
            raise InvalidEndpoint("circuit_failures must be a whole number from 0 (never open) up")
        if name == "circuit_cooldown" and not (
            math.isfinite(value) and MIN_COOLDOWN <= value <= 86400
        ):
            raise InvalidEndpoint(f"circuit_cooldown must be from {MIN_COOLDOWN} to 86400 seconds")
        checked[name] = value
    return checked
