"""Endpoint health: a circuit breaker per endpoint, in PostgreSQL, shared by every poller.

::

                 N failed sends in a row                 cool-down passed and a
    ┌────────┐ ─────────────────────────▶ ┌──────┐ ───── message is due: claim ───▶ ┌───────────┐
    │ closed │                            │ open │        one, the probe            │ half_open │
    └────────┘ ◀──── any success ──────── └──────┘ ◀──── the probe failed ───────── └───────────┘
        ▲              (a message in flight      (cool-down doubled, capped)             │
        └──────────────────────── the probe (or any send) succeeded ────────────────────┘

* **Closed**: messages are claimed as usual. Every completion batch tells the
  endpoint's row what its sends did (COMPLETE_BATCH): a success resets the
  count of consecutive failed sends; a failed send — no answer, a 5xx, 408 or
  429 — adds one. A 4xx that is not 408/429 does not count: the receiver is up
  and refusing that message. ``POLLER_CIRCUIT_FAILURES`` in a row open the
  circuit (0, the default for now, never opens it).
* **Open**: the claim skips the endpoint. Its messages wait **without spending
  attempts**; nothing is sent. After the cool-down (``POLLER_CIRCUIT_COOLDOWN``,
  default 30 s) the next claim that finds one of its messages due turns it
  half-open and takes that message alone: the probe.
* **Half-open**: one message in flight. Its success closes the circuit (the
  backlog then drains at the endpoint's ``max_in_flight``); its failure opens it
  again for twice the cool-down, up to ``POLLER_CIRCUIT_COOLDOWN_MAX`` (default
  15 min). A probe that never reports (its poller died) is replaced after two
  claim leases.

The state lives in ``poller_endpoint_health`` (one row per endpoint, made by a
trigger with the endpoint), so every poller agrees on it; transitions happen in
the claim and completion statements, with no extra round trip.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Circuit:
    """The breaker's settings (``POLLER_CIRCUIT_*``)."""

    failures: int = 0  # consecutive failed sends that open the circuit; 0: never open
    cooldown: float = 30.0  # seconds open before the first probe
    cooldown_max: float = 900.0  # the cool-down doubles on each failed probe, up to this

    def params(self) -> dict[str, float]:
        return {
            "circuit_failures": self.failures,
            "circuit_cooldown": self.cooldown,
            "circuit_cooldown_max": self.cooldown_max,
        }
