"""Locust users creating orders; end-to-end delivery latency reported as a locust stat.

Run by ``python -m loadtest.run`` (``make loadtest``); by hand:
``locust -f loadtest/locustfile.py --host http://127.0.0.1:8000`` with
``LOADTEST_RECEIVER_URL`` set. Tasks are tagged ``steady`` (one order) and
``burst`` (five at once). A background greenlet polls the receiver's
``/receipts`` and fires one ``E2E commit→receipt`` request event per delivered
order, timed from the moment the app answered (after COMMIT) — so locust's
stats and HTML report show end-to-end latency next to the HTTP figures.
"""

from __future__ import annotations

import os
import random
import time
from typing import Any

import gevent
import requests
from locust import FastHttpUser, between, events, tag, task

COMMITTED: dict[str, float] = {}  # key -> when the app confirmed the commit
_REPORTED: set[str] = set()


class OrderUser(FastHttpUser):
    wait_time = between(0.05, 0.2)

    def _order(self) -> None:
        body = {
            "customer": f"c{random.randrange(10_000)}",
            "amount_cents": random.randrange(100, 99_999),
        }
        with self.client.post(
            "/orders", json=body, name="POST /orders", catch_response=True
        ) as response:
            if response.status_code != 201:
                response.failure(f"HTTP {response.status_code}")
                return
            COMMITTED[response.json()["key"]] = time.time()

    @tag("steady")
    @task(10)
    def steady(self) -> None:
        self._order()

    @tag("burst")
    @task(1)
    def burst(self) -> None:
        for _ in range(5):
            self._order()


def _watch_receipts(environment: Any) -> None:
    url = os.environ.get("LOADTEST_RECEIVER_URL")
    if not url:
        return
    while True:
        gevent.sleep(1.0)
        try:
            receipts = requests.get(f"{url}/receipts", timeout=5).json()
        except (requests.RequestException, ValueError):
            continue
        for key, received_at in receipts.items():
            committed = COMMITTED.get(key)
            if committed is None or key in _REPORTED:
                continue
            _REPORTED.add(key)
            environment.events.request.fire(
                request_type="E2E",
                name="commit→receipt",
                response_time=max(0.0, (received_at - committed) * 1000),
                response_length=0,
                exception=None,
                context={},
            )


@events.test_start.add_listener
def _start_watcher(environment: Any, **_: Any) -> None:
    gevent.spawn(_watch_receipts, environment)
