"""Where commit→receipt goes at a steady rate: the poller traced in this process.

    python -m loadtest.latency [--rates 500,1500,3000] [--seconds 5]

For each rate, a fresh database and `poller run`'s service in this process (on
uvloop), the signature-checking receiver and the enqueuer in processes of their
own: messages are committed at the rate in transactions of 10 (as the latency
phase of ``loadtest.deliveries``), and each one's moments are noted on the way:
the claim that took it began and returned, its send began, the receiver
applied it. Printed per rate, p50 and p90 of each step:

* commit → claim: the NOTIFY, the claim loop's wake-up, a claim already under way;
* the claim: CLAIM_BATCH's round trip, endpoints read if need be, the tasks started;
* claim → send: the delivery's task waits for the loop until its send begins;
* send → receipt: signing, the HTTP client, the wire, the receiver checking the
  signature.

Everything shares the machine's cores, so at high rates every step waits for
CPU: compare the rates.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import httpx

from loadtest.bench_db import fresh_database, server_url
from loadtest.deliveries import paced, start_receiver
from poller.claim.claimer import Claimer
from poller.cli import run as cli_run
from poller.deliver.dispatcher import Dispatcher
from poller.endpoints.registry import create_endpoint, new_secret
from poller.rules.outcomes import ClaimedMessage
from poller.settings import load_settings
from poller.store.db import sync_engine

CLAIMED: dict[str, tuple[float, float]] = {}  # key -> the claim that took it: began, returned
SENT: dict[str, float] = {}  # key -> its send began


def _traced() -> None:
    """Note each message's claim and send (this process's poller only)."""
    claim = Claimer._claim

    async def traced_claim(self: Claimer, limit: int) -> int:
        began = time.time()
        claimed = await claim(self, limit)
        returned = time.time()
        for msg in self.dispatcher.tasks.values():
            CLAIMED.setdefault(msg.idempotency_key, (began, returned))
        return claimed

    send = Dispatcher._send

    async def traced_send(self: Dispatcher, msg: ClaimedMessage, *args: Any) -> Any:
        SENT[msg.idempotency_key] = time.time()
        return await send(self, msg, *args)

    Claimer._claim = traced_claim  # type: ignore[method-assign]
    Dispatcher._send = traced_send  # type: ignore[method-assign,assignment]


def _enqueue(url: str, rate: str, seconds: str, out: str) -> None:
    """The enqueuer's process: commit at ``rate``; write each key's commit time to ``out``."""
    committed = paced(sync_engine(url), float(rate), float(seconds), 120)
    Path(out).write_text(json.dumps(committed))


async def _measured(url: str, rate: float, seconds: float, out: str) -> dict[str, float]:
    service = asyncio.create_task(cli_run.run_service(load_settings(), url, "latency"))
    try:
        await asyncio.sleep(1.0)  # a warm-up, not synchronisation: the service runs
        args = ["-c", "import sys; from loadtest.latency import _enqueue; _enqueue(*sys.argv[1:])"]
        enqueuer = await asyncio.create_subprocess_exec(
            sys.executable, *args, url, str(rate), str(seconds), out
        )
        if await asyncio.wait_for(enqueuer.wait(), seconds + 150):
            raise SystemExit("latency: the enqueuer failed")
        committed: dict[str, float] = json.loads(Path(out).read_text())
        return committed
    finally:
        os.kill(os.getpid(), signal.SIGTERM)  # run_service's own graceful stop
        await service


def _spread(values: list[float]) -> str:
    ordered = sorted(values)
    p50, p90 = ordered[len(ordered) // 2], ordered[int(len(ordered) * 0.9)]
    return f"{p50 * 1000:5.2f} / {p90 * 1000:5.2f}"


def _report(rate: float, committed: Mapping[str, float], receipts: Mapping[str, float]) -> str:
    keys = [k for k in committed if k in receipts and k in CLAIMED and k in SENT]
    steps: list[tuple[str, Callable[[str], float]]] = [
        ("commit → claim", lambda k: CLAIMED[k][0] - committed[k]),
        ("the claim", lambda k: CLAIMED[k][1] - CLAIMED[k][0]),
        ("claim → send", lambda k: SENT[k] - CLAIMED[k][1]),
        ("send → receipt", lambda k: receipts[k] - SENT[k]),
        ("commit → receipt", lambda k: receipts[k] - committed[k]),
    ]
    cells = " | ".join(_spread([step(k) for k in keys]) for _, step in steps)
    return f"| {rate:,.0f}/s | {len(keys):,} | {cells} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", default="500,1500,3000", help="messages/s, comma-separated")
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    _traced()
    secret = new_secret()
    rows = []
    with server_url() as admin:
        for n, rate in enumerate(float(r) for r in args.rates.split(",")):
            CLAIMED.clear()
            SENT.clear()
            url = fresh_database(admin, f"poller_latency_{n}")
            with tempfile.TemporaryDirectory(prefix="poller-latency-") as tmp:
                receiver, receiver_url = start_receiver(Path(tmp), secret, "receiver")
                try:
                    engine = sync_engine(url)
                    with engine.begin() as conn:
                        create_endpoint(
                            conn, "bench", f"{receiver_url}/bench", secret=secret,
                            max_in_flight=64, allow_private=True, event_types=["order.*"],
                        )  # fmt: skip
                    engine.dispose()
                    os.environ.update(
                        POLLER_DATABASE_URL=url,
                        POLLER_ALLOW_PRIVATE_TARGETS="true",
                        POLLER_METRICS_ADDR="127.0.0.1:0",
                    )
                    out = str(Path(tmp) / "committed.json")
                    committed = cli_run.event_loop_run(_measured(url, rate, args.seconds, out))
                    receipts = httpx.get(f"{receiver_url}/receipts", timeout=30).json()
                finally:
                    receiver.stop()
            rows.append(_report(rate, committed, receipts))
    print("commit→receipt by step, ms (p50 / p90), one poller traced in process")
    print(
        "| rate | messages | commit → claim | the claim | claim → send "
        "| send → receipt | commit → receipt |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
