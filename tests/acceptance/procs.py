"""Real `poller` subprocesses for acceptance tests: start, read, signal, always clean up."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from loadtest.procs import Proc, clean_env

FAST_ENV = {
    "POLLER_RETRY_SCHEDULE": "[0.05]",
    "POLLER_REQUEST_TIMEOUT": "1",
    "POLLER_CLAIM_LEASE": "3",
    "POLLER_POLL_INTERVAL": "0.2",
    "POLLER_SWEEP_INTERVAL": "0.3",
    "POLLER_LEASE_TTL": "1.5",
    "POLLER_ALLOW_PRIVATE_TARGETS": "true",
    "POLLER_CIRCUIT_COOLDOWN": "0.2",
    "POLLER_CIRCUIT_COOLDOWN_MAX": "0.5",
}


def poller_env(**env: str) -> dict[str, str]:
    return clean_env(**{**FAST_ENV, **env})


@contextlib.contextmanager
def started(args: list[str], env: dict[str, str], log: Path) -> Iterator[Proc]:
    proc = Proc(args, env, log)
    try:
        yield proc
    except BaseException:  # pytest shows this under "Captured stdout": what the process saw
        print(f"--- last lines of {log.name} ---", *proc.output().splitlines()[-60:], sep="\n")
        raise
    finally:
        proc.stop(timeout=10, graceful=False)


@contextlib.contextmanager
def receiver(tmp: Path, *flags: str) -> Iterator[tuple[Proc, str]]:
    with started(["receiver", "--port", "0", *flags], poller_env(), tmp / "receiver.log") as proc:
        port = proc.wait_for(r"listening on http://127\.0\.0\.1:(\d+)").group(1)
        yield proc, f"http://127.0.0.1:{port}"


def stats(url: str) -> dict[str, Any]:
    return dict(httpx.get(f"{url}/stats", timeout=5).json())


def wait_until(condition: Any, timeout: float = 30, interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)


__all__ = ["Proc", "poller_env", "receiver", "started", "stats", "wait_until"]
