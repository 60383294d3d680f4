"""The supervisor's merged /metrics (poller/service/processes.py): each child's series keep
their labels plus ``process``; a garbled child is skipped, not fatal."""

from __future__ import annotations

from prometheus_client import generate_latest

from poller.service.processes import Fleet


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


async def test_a_starting_child_is_not_taken_for_a_hung_one() -> None:
    """Before its first /healthz answer a child is starting (imports, database checks
    on a busy host): POLLER_CHILD_HUNG_AFTER applies only once it has answered."""
    import asyncio
    import sys
    import time

    from poller.service.processes import STARTUP_GRACE

    fleet = Fleet(1, base="f", env={}, metrics_addr=None, hung_after=2)
    child = fleet.children[0]
    child.proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "import time; time.sleep(60)"
    )
    try:
        child.answered = time.monotonic() - 5  # started 5 s ago, no port written yet
        await fleet._probe(child)
        assert child.running, "killed while starting"
        child.answered = time.monotonic() - STARTUP_GRACE - 1
        await fleet._probe(child)
        assert await asyncio.wait_for(child.proc.wait(), 10) == -9  # stuck starting: killed
        child.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", "import time; time.sleep(60)"
        )
        child.serving, child.answered = True, time.monotonic() - 3
        await fleet._probe(child)  # it answered once, then went silent for 3 s > 2
        assert await asyncio.wait_for(child.proc.wait(), 10) == -9
    finally:
        if child.proc.returncode is None:
            child.proc.kill()
            await child.proc.wait()
