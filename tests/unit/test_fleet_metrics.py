"""The supervisor's merged /metrics (poller/processes.py): each child's series keep
their labels plus ``process``; a garbled child is skipped, not fatal."""

from __future__ import annotations

from prometheus_client import generate_latest

from poller.processes import Fleet


def test_children_metrics_merge_with_a_process_label_and_garbage_is_skipped() -> None:
    fleet = Fleet(3, base="f", env={}, metrics_addr=None)
    child = (
        "# HELP webhook_poller_claimed_total Messages claimed.\n"
        "# TYPE webhook_poller_claimed_total counter\n"
        "webhook_poller_claimed_total {n}\n"
    )
    fleet._scraped = [(0, child.format(n=5)), (1, "this is { not metrics"), (2, child.format(n=7))]
    text = generate_latest(fleet.registry).decode()
    assert 'webhook_poller_claimed_total{process="0"} 5.0' in text
    assert 'webhook_poller_claimed_total{process="2"} 7.0' in text
    assert 'process="1"' not in text
    assert text.count("# TYPE webhook_poller_claimed_total counter") == 1
    assert "webhook_poller_children_up 0.0" in text
