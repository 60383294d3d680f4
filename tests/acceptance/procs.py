"""Real `poller` subprocesses for acceptance tests: start, read, signal, always clean up."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

FAST_ENV = {
    "POLLER_RETRY_SCHEDULE": "[0.05]",
    "POLLER_REQUEST_TIMEOUT": "1",
    "POLLER_CLAIM_LEASE": "3",
    "POLLER_POLL_INTERVAL": "0.2",
    "POLLER_SWEEP_INTERVAL": "0.3",
    "POLLER_LEASE_TTL": "1.5",
    "POLLER_ALLOW_PRIVATE_TARGETS": "true",
}


def poller_env(**env: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("POLLER_")}
    return {**base, **FAST_ENV, **env}


class Proc:
    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        self._out = open(log, "w")  # noqa: SIM115 - closed in stop()
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "poller", *args],
            env=env,
            stdout=self._out,
            stderr=subprocess.STDOUT,
        )

    def output(self) -> str:
        return self.log.read_text()

    def wait_for_output(self, pattern: str, timeout: float = 20) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = re.search(pattern, self.output())
            if found:
                return found
            if self.popen.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"{pattern!r} not in output:\n{self.output()}")

    def signal(self, signum: int) -> None:
        self.popen.send_signal(signum)

    def wait(self, timeout: float) -> int:
        return self.popen.wait(timeout=timeout)

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(timeout=10)
        self._out.close()


@contextlib.contextmanager
def started(args: list[str], env: dict[str, str], log: Path) -> Iterator[Proc]:
    proc = Proc(args, env, log)
    try:
        yield proc
    finally:
        proc.stop()


@contextlib.contextmanager
def receiver(tmp: Path, *flags: str) -> Iterator[tuple[Proc, str]]:
    with started(["receiver", "--port", "0", *flags], poller_env(), tmp / "receiver.log") as proc:
        port = proc.wait_for_output(r"listening on http://127\.0\.0\.1:(\d+)").group(1)
        yield proc, f"http://127.0.0.1:{port}"


def stats(url: str) -> dict[str, Any]:
    return dict(httpx.get(f"{url}/stats", timeout=5).json())


def wait_until(condition: Any, timeout: float = 30, interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)


__all__ = ["poller_env", "receiver", "signal", "started", "stats", "wait_until"]
