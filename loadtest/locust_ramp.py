"""Locust for ``make loadtest-ramp``: an order rate raised step by step (LoadTestShape).

Each user places orders at a constant ``LOADTEST_PER_USER`` per second
(locust's ``constant_throughput``), so a step's user count sets its offered
order rate: ``LOADTEST_RATES`` (orders/s, comma separated), one step every
``LOADTEST_STEP_SECONDS``. A user whose order takes longer than its pace falls
behind: the offered rate is then not reached, which the ramp reports as the
load generator or the app being the limit, not the poller. Each order's key
and the time its answer (sent after COMMIT returned) arrived go to
``LOADTEST_ANSWERS_FILE``. Started (and stopped early once a step breaks the
SLO) by ``python -m loadtest.ramp``.
"""

from __future__ import annotations

import math
import os
import random
import time
from pathlib import Path

from locust import FastHttpUser, LoadTestShape, constant_throughput, task

RATES = [float(r) for r in os.environ.get("LOADTEST_RATES", "50,100").split(",")]
STEP_SECONDS = float(os.environ.get("LOADTEST_STEP_SECONDS", "15"))
PER_USER = float(os.environ.get("LOADTEST_PER_USER", "5"))
# key -> when the app's answer arrived, one line each (line-buffered: a SIGTERM loses none).
_answers_path = os.environ.get("LOADTEST_ANSWERS_FILE")
ANSWERS = open(_answers_path, "a", buffering=1) if _answers_path else None  # noqa: SIM115


class OrderUser(FastHttpUser):
    wait_time = constant_throughput(PER_USER)

    @task
    def order(self) -> None:
        body = {"customer": f"c{random.randrange(10_000)}", "amount_cents": 1234}
        with self.client.post(
            "/orders", json=body, name="POST /orders", catch_response=True
        ) as response:
            if response.status_code != 201:
                response.failure(f"HTTP {response.status_code}")
            elif ANSWERS is not None:  # the app answers after COMMIT returned
                ANSWERS.write(f"{response.json()['key']} {time.time()!r}\n")


class Steps(LoadTestShape):
    """Users for each step's rate, all spawned within a second of the step's start."""

    _told = False

    def tick(self) -> tuple[int, float] | None:
        run_time = self.get_run_time()
        path = os.environ.get("LOADTEST_T0_FILE")
        if path and not self._told:  # the wall-clock time of the shape's zero, for the ramp
            Path(path).write_text(repr(time.time() - run_time))
            self._told = True
        step = int(run_time // STEP_SECONDS)
        if step >= len(RATES):
            return None
        users = max(1, math.ceil(RATES[step] / PER_USER))
        return users, float(users)
