"""The load test's invariants (loadtest/report.py): none holds of a run that did nothing."""

from __future__ import annotations

from loadtest.report import holds

FIGURES = {"lost": 0, "duplicate_effects": 0, "delivered": 0, "failed": 0, "orders_committed": 0}


def test_a_load_test_that_committed_nothing_is_broken() -> None:
    assert holds(FIGURES) == ["no order was committed: the load never reached the application"]
    ran = {**FIGURES, "orders_committed": 3, "delivered": 2, "failed": 1}
    assert holds(ran) == []
