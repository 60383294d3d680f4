"""The ramp's verdict (loadtest/ramp.py): which step is the knee, and what saturated."""

from __future__ import annotations

from typing import Any

from loadtest.ramp import _step_figures, knee


def _step(offered: float, committed: float, p99: float | None, **extra: Any) -> dict[str, Any]:
    return {
        "offered_per_s": offered,
        "committed_per_s": committed,
        "undelivered": extra.pop("undelivered", 0),
        "latency_ms": {"p50": 1.0, "p95": 1.0, "p99": p99},
        "cpu_cores": extra.pop("cpu", {"poller-0": 0.3, "app": 0.2}),
        "machine_busy": extra.pop("busy", 0.5),
    }


def test_the_knee_is_the_last_step_within_the_slo_before_the_first_breach() -> None:
    steps = [
        _step(100, 100, 20),
        _step(200, 199, 40),
        _step(400, 390, 1500, cpu={"poller-0": 0.97, "app": 0.5, "postgres": 0.9}),
        _step(800, 700, 30),  # after the breach: not counted even though it looks fine
    ]
    verdict = knee(steps, slo_ms=1000)
    assert verdict["orders_per_s"] == 199
    assert verdict["broke_at_offered_per_s"] == 400
    assert verdict["saturated"] == ["poller-0 (0.97 core)", "postgres (0.90 core)"]
    assert not verdict["generator_bound"]


def test_an_undelivered_order_breaks_the_step_and_a_busy_machine_is_named() -> None:
    steps = [_step(100, 100, 20), _step(200, 150, 30, undelivered=3, busy=0.97)]
    verdict = knee(steps, slo_ms=1000)
    assert verdict["orders_per_s"] == 100
    assert verdict["saturated"] == ["the machine (97% busy)"]
    assert verdict["generator_bound"]  # 150 of 200 offered were placed


def test_no_breach_means_the_last_step_is_judged_and_no_knee_when_the_first_breaks() -> None:
    assert knee([_step(100, 100, 20), _step(200, 200, 30)], 1000)["broke_at_offered_per_s"] is None
    assert knee([_step(100, 100, 2000)], 1000)["orders_per_s"] is None


def test_step_figures_count_a_missing_receipt_as_infinitely_late() -> None:
    rows = [(f"k{i}", 10.0 + i / 100) for i in range(100)]  # 100 orders in [10, 11)
    receipts = {f"k{i}": 10.0 + i / 100 + 0.005 for i in range(99)}  # k99 never arrived
    figures = _step_figures(rows, {}, receipts, 10.0, 11.0)
    assert figures["committed_per_s"] == 100 and figures["undelivered"] == 1
    assert round(figures["latency_ms"]["p50"], 3) == 5.0
    assert figures["latency_ms"]["p99"] == float("inf")
