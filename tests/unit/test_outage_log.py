"""A database outage is logged when it starts, once per interval, and when it ends."""

from __future__ import annotations

import logging

import pytest

from poller.observe.logs import OutageLog


def test_an_outage_is_one_line_then_a_count_then_one_line_on_recovery(
    caplog: pytest.LogCaptureFixture,
) -> None:
    outage = OutageLog("claiming", every=3600)
    with caplog.at_level(logging.WARNING, logger="poller.outage"):
        for _ in range(50):
            outage.failed(ConnectionRefusedError("connection refused"))
        outage.recovered()
        outage.recovered()  # nothing more to say
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "claiming: database unavailable (1 failure so far), retrying: connection refused",
        "claiming: database back after 50 failures",
    ]


def test_a_long_outage_says_so_once_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    outage = OutageLog("claiming", every=0.0)
    with caplog.at_level(logging.WARNING, logger="poller.outage"):
        for _ in range(3):
            outage.failed(TimeoutError("pool timeout"))
    assert [r.getMessage().split(" (")[1].split(" so far")[0] for r in caplog.records] == [
        "1 failure",
        "2 failures",
        "3 failures",
    ]
