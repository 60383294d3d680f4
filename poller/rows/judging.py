"""What a completion's applied attempts tell their endpoints' health, and whether
JUDGE_HEALTH needs to hear it.

:func:`health_signals` sums, per endpoint, the attempts COMPLETE_BATCH applied:
deliveries, failed requests (poller/rules/health.py ``is_endpoint_failure``), the
longest Retry-After pause, a 410's reason, the last error. JUDGE_HEALTH
(poller/store/queries/claims.py) turns them into the circuit's state.

Most completions of a healthy drain tell an endpoint nothing new: deliveries
only, to an endpoint whose circuit is closed, with no failure streak and a
success recorded within the second. JUDGE_HEALTH leaves such an endpoint alone;
:func:`judging_due` sees the same from what COMPLETE_BATCH returned (each row's
``healthy``, and ``backlog``), so such a completion does not run it at all.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from poller.rules.health import is_endpoint_failure
from poller.rules.outcomes import Outcome, clean_text


@dataclass(slots=True)
class Signal:
    """What one completion's applied attempts tell an endpoint's health (JUDGE_HEALTH)."""

    ok: int = 0  # deliveries
    bad: int = 0  # failed requests (poller/rules/health.py is_endpoint_failure)
    pause: float | None = None  # the longest Retry-After pause asked for
    gone: str | None = None  # a 410's disable reason
    error: str | None = None  # the last failed request's error: "HTTP 503", "ConnectError"

    @property
    def news(self) -> bool:
        """Something JUDGE_HEALTH acts on whatever the endpoint's state."""
        return self.bad > 0 or self.pause is not None or self.gone is not None

    def add(self, other: Signal) -> None:
        """Fold a later signal of the same endpoint into this one."""
        self.ok += other.ok
        self.bad += other.bad
        if other.pause is not None:
            self.pause = max(self.pause or 0.0, other.pause)
        self.gone = other.gone or self.gone
        self.error = other.error or self.error


def health_signals(
    outcomes: Sequence[Outcome], endpoint_of: Mapping[int, int]
) -> dict[int, Signal]:
    """Per endpoint, what the applied outcomes say (``endpoint_of``: applied message id →
    its endpoint, from COMPLETE_BATCH's rows). Every failed request counts, probes and
    last attempts included."""
    signals: dict[int, Signal] = {}
    for o in outcomes:
        endpoint_id = endpoint_of.get(o.message_id)
        if endpoint_id is None or o.kind not in ("send", "lookup"):  # expiry: nothing was sent
            continue
        signal = signals.get(endpoint_id)
        if signal is None:
            signal = signals[endpoint_id] = Signal()
        if o.outcome == "delivered":
            signal.ok += 1
            continue
        if is_endpoint_failure(o.status_code, o.outcome):
            signal.bad += 1
        if o.status_code is not None or o.error_class:
            signal.error = f"HTTP {o.status_code}" if o.status_code is not None else o.error_class
        if o.pause is not None:
            signal.pause = max(signal.pause or 0.0, o.pause)
        if o.disable_reason is not None:
            signal.gone = clean_text(o.disable_reason)
    return signals


def judging_due(
    signals: Mapping[int, Signal], healthy: Mapping[int, bool | None], backlog: bool
) -> bool:
    """Whether JUDGE_HEALTH would change anything: a signal with news, an endpoint not
    ``healthy`` (COMPLETE_BATCH's column: NULL when it has no health row), or signals
    waiting in the backlog. Mirrors JUDGE_HEALTH's ``wanted``."""
    if not signals:
        return False
    return backlog or any(s.news or not healthy.get(e) for e, s in signals.items())


def signals_json(signals: Mapping[int, Signal]) -> str:
    return json.dumps(
        [
            {
                "endpoint_id": e,
                "ok": s.ok,
                "bad": s.bad,
                "pause": s.pause,
                "gone": s.gone,
                "error": None if s.error is None else clean_text(s.error, 200),
            }
            for e, s in signals.items()
        ]
    )
