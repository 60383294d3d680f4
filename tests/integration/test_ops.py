"""Metrics, health and readiness over HTTP; JSON logs without secrets."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine

from poller.local.embedded import EmbeddedPostgres, free_port
from poller.local.receiver import Faults
from poller.service.ops import serving
from poller.store import migrate
from poller.store.db import poller_engine
from tests.conftest import make_endpoint
from tests.integration.helpers import seed, wait_for
from tests.integration.service_helpers import (
    counts,
    fast_settings,
    running_poller,
    running_receiver,
)


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def _value(samples: dict, name: str, **labels: str) -> float:  # type: ignore[type-arg]
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def test_metrics_move_with_the_receivers_counts(engine: Engine, db_url: str) -> None:
    port = free_port()
    settings = fast_settings(metrics_addr=f"127.0.0.1:{port}")
    async with running_receiver(Faults(fail_rate=0.2)) as (receiver, url):
        make_endpoint(engine, "ops-a", url=url)
        async with running_poller(db_url, settings), httpx.AsyncClient() as http:
            before = _samples((await http.get(f"http://127.0.0.1:{port}/metrics")).text)
            seed(engine, 200, "ops-a")

            async def done() -> bool:
                return counts(engine) == {"delivered": 200}

            await wait_for(done, timeout=30)
            after: dict = {}  # type: ignore[type-arg]

            async def gauges_refreshed() -> bool:  # by the maintenance leader's next sweep
                after.clear()
                after.update(_samples((await http.get(f"http://127.0.0.1:{port}/metrics")).text))
                pending = after.get(("webhook_poller_messages", (("status", "pending"),)))
                # an endpoint at rest has no per-endpoint series
                return (
                    pending == 0
                    and ("webhook_poller_pending_due", (("endpoint", "ops-a"),)) not in after
                )

            await wait_for(gauges_refreshed, timeout=10)
            health = await http.get(f"http://127.0.0.1:{port}/healthz")
            ready = await http.get(f"http://127.0.0.1:{port}/readyz")
    delta = {
        outcome: _value(
            after, "webhook_poller_delivery_outcomes_total", endpoint="ops-a", outcome=outcome
        )
        - _value(
            before, "webhook_poller_delivery_outcomes_total", endpoint="ops-a", outcome=outcome
        )
        for outcome in ("delivered", "retry")
    }
    assert delta["delivered"] == receiver.stats.applied == 200
    assert delta["retry"] == receiver.stats.failed_injected
    sends = _value(after, "webhook_poller_attempts_total", kind="send") - _value(
        before, "webhook_poller_attempts_total", kind="send"
    )
    assert sends == receiver.stats.received
    assert _value(after, "webhook_poller_shards_held") >= 1
    assert health.status_code == 200 and ready.json()["status"] == "ready"


@pytest.mark.slow
async def test_readyz_fails_while_the_database_is_down_and_recovers(tmp_path: Path) -> None:
    server = EmbeddedPostgres(tmp_path, durable=False)
    url = server.start()
    migrate.upgrade(url)
    engine = poller_engine(url, fast_settings())
    port = free_port()
    try:
        async with serving(f"127.0.0.1:{port}", engine), httpx.AsyncClient() as http:
            ready = f"http://127.0.0.1:{port}/readyz"
            assert (await http.get(ready)).status_code == 200
            await asyncio.to_thread(server.stop)
            down = await http.get(ready, timeout=10)
            assert down.status_code == 503 and "database" in down.json()["reason"]
            assert (await http.get(f"http://127.0.0.1:{port}/healthz")).status_code == 200
            await asyncio.to_thread(server.start)

            async def back() -> bool:
                return (await http.get(ready, timeout=10)).status_code == 200

            await wait_for(back, timeout=20)
    finally:
        await engine.dispose()
        server.stop()


def test_poller_run_serves_metrics_and_logs_json_without_secrets(
    engine: Engine, db_url: str, tmp_path: Path
) -> None:
    from tests.acceptance.procs import poller_env, receiver, started, stats, wait_until

    with receiver(tmp_path, "--fail-rate", "0.5", "--status", "500") as (_, url):
        secret = make_endpoint(engine, "a", url=url, max_attempts=2).secret
        seed(engine, 50, "a")
        port = free_port()
        env = poller_env(
            POLLER_DATABASE_URL=db_url,
            POLLER_LOG_FORMAT="json",
            POLLER_METRICS_ADDR=f"127.0.0.1:{port}",
        )
        with started(["run", "--id", "logs"], env, tmp_path / "poller.log") as poller:
            wait_until(lambda: stats(url)["received"] >= 60, timeout=30)
            wait_until(
                lambda: (
                    counts(engine).get("pending", 0) == 0
                    and counts(engine).get("in_flight", 0) == 0
                ),
                timeout=30,
            )
            scraped = _samples(httpx.get(f"http://127.0.0.1:{port}/metrics").text)
            seen = stats(url)
            poller.signal(15)
            poller.wait(timeout=20)
            lines = [json.loads(line) for line in poller.output().splitlines() if line.strip()]
    assert secret not in poller.output()
    assert secret not in json.dumps(list(scraped))  # nor in any metric label
    with engine.connect() as conn:  # nor in any attempt row
        from sqlalchemy import text

        attempts = conn.execute(text("SELECT * FROM poller_delivery_attempts")).all()
    assert attempts and secret not in repr(attempts)
    sent = _value(scraped, "webhook_poller_attempts_total", kind="send")
    delivered = _value(
        scraped, "webhook_poller_delivery_outcomes_total", endpoint="a", outcome="delivered"
    )
    assert sent == seen["received"] and delivered == seen["unique"]
    # a delivery's failure lines (an operational event may say "failed" too: ten failed
    # sends in a row at a 50 % failure rate open the circuit in a run or two of a
    # hundred, and that line names the endpoint, not a message)
    failures = [
        line
        for line in lines
        if "failed" in line["message"] and line["logger"] == "poller.deliver.dispatcher"
    ]
    assert failures and all(
        {"message_id", "key", "attempt", "endpoint"} <= set(line) for line in failures
    )
