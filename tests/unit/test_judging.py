"""When a completion's health signals need JUDGE_HEALTH (poller/rows/judging.py)."""

from __future__ import annotations

import pytest

from poller.rows.judging import Signal, judging_due


@pytest.mark.parametrize(
    ("signal", "healthy", "backlog", "due"),
    [
        (Signal(ok=3), True, False, False),  # deliveries to a healthy endpoint: nothing new
        (Signal(ok=3), False, False, True),  # a circuit to close, a streak to reset
        (Signal(ok=3), None, False, True),  # no health row read: let JUDGE_HEALTH see
        (Signal(ok=3), True, True, True),  # signals wait in the backlog: fold them in
        (Signal(ok=2, bad=1), True, False, True),
        (Signal(pause=1.0), True, False, True),
        (Signal(gone="410 Gone from a"), True, False, True),
    ],
)
def test_judging_is_due_when_it_would_change_something(
    signal: Signal, healthy: bool | None, backlog: bool, due: bool
) -> None:
    assert judging_due({7: signal}, {7: healthy}, backlog) is due


def test_no_signal_needs_no_judging_even_with_a_backlog() -> None:
    assert judging_due({}, {}, True) is False  # the maintenance sweep folds it in


def test_a_later_signal_folds_into_an_earlier_one() -> None:
    earlier = Signal(ok=1, bad=2, pause=5.0, error="HTTP 503")
    earlier.add(Signal(ok=1, pause=1.0, gone="410 Gone from a", error="ConnectError"))
    assert earlier == Signal(ok=2, bad=2, pause=5.0, gone="410 Gone from a", error="ConnectError")


def test_a_retried_completion_folds_carried_signals_in_once() -> None:
    """The carried signals stay as they were until the follow-ups commit: a completion
    whose transaction rolled back and is written again counts its sends once."""
    from poller.rows.completions import Completions
    from poller.rules.outcomes import Outcome
    from poller.store.db import async_engine

    claims = Completions(async_engine("postgresql://u@127.0.0.1:1/x"), poller_id="p")
    claims._carried_signals = {7: Signal(ok=1)}
    outcome = Outcome(1, 5, 1, "delivered", "delivered")
    rows = [(1, 7, "delivered", None, True, False)]  # COMPLETE_BATCH's row
    for _ in range(2):  # the first try rolled back
        assert claims._follow_ups([outcome], rows).signals == {7: Signal(ok=2)}
    assert claims._carried_signals == {7: Signal(ok=1)}
