"""The brokers the project starts for itself (poller/local/brokers.py) leave nothing behind."""

from __future__ import annotations

import time
from pathlib import Path

from poller.local.brokers import EmbeddedRabbitMQ, _epmd_on, _port_in


def test_a_rabbitmq_launched_and_stopped_before_it_was_up_leaves_no_epmd(tmp_path: Path) -> None:
    """A test run begins RabbitMQ's boot early and may end before any test waited for it:
    its epmd, on a port of its own, must go with it."""
    server = EmbeddedRabbitMQ(tmp_path)
    server.launch()
    try:
        port = _port_in(dict(
            line.partition("=")[::2] for line in (server.dir / "ports").read_text().splitlines()
        )["epmd"])  # fmt: skip
        assert port is not None
        deadline = time.monotonic() + 30
        while _epmd_on(port) is None:
            assert time.monotonic() < deadline, "RabbitMQ's epmd never started"
            time.sleep(0.05)
    finally:
        server.stop()
    assert _epmd_on(port) is None
