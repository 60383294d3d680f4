"""What a dead endpoint costs its healthy neighbours, with the circuit breaker off and on.

    python -m loadtest.health [--messages 10000] [--dead 5000] [--rounds 3]

One `poller run` process per configuration, the same receiver for the healthy
endpoint "bench", and a dead endpoint (a closed port: every send is refused):

1. alone: --messages committed at once to "bench", time until all delivered;
2. breaker off (``POLLER_CIRCUIT_FAILURES=0``): --dead messages to the dead
   endpoint first (retried every 0.2 s, attempts to spare), then the same drain;
3. breaker on (the default, 10 failed sends): the same.

The rounds alternate 1, 2, 3; medians. Figures: deliveries/s of "bench" and
the ratio to "alone" (target for 3: ≥ 0.9), and the requests the dead
endpoint was sent during the drain (2: thousands; 3: the sends that opened
the circuit and a probe or two).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from loadtest.bench_db import fresh_database, server_url
from loadtest.deliveries import _payload, start_receiver
from loadtest.ordered import drain
from loadtest.procs import Proc, clean_env
from poller import Message, enqueue_many
from poller.endpoints.registry import create_endpoint, new_secret
from poller.local.embedded import free_port
from poller.store.db import sync_engine

CONCURRENCY = 64


def _attempts_to_dead(engine: Any) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                text(
                    "SELECT count(*) FROM poller_delivery_attempts a JOIN poller_outbox o "
                    "ON o.id = a.message_id JOIN poller_endpoints e ON e.id = o.endpoint_id "
                    "WHERE e.name = 'dead'"
                )
            ).scalar_one()
        )


def one_round(
    admin_url: str, tmp: Path, receiver_url: str, secret: str, mode: str, n: int, args: Any
) -> tuple[float, int]:
    """Deliveries/s of "bench" in ``mode`` (alone | off | on), and requests to the dead one."""
    url = fresh_database(admin_url, "bench_health")
    engine = sync_engine(url)
    with engine.begin() as conn:
        create_endpoint(conn, "bench", f"{receiver_url}/bench", secret=secret, allow_private=True)
        create_endpoint(
            conn,
            "dead",
            f"http://127.0.0.1:{free_port()}/dead",
            secret=secret,
            allow_private=True,
            max_attempts=1000,
        )
    env = clean_env(
        POLLER_DATABASE_URL=url,
        POLLER_CONCURRENCY=str(CONCURRENCY),
        POLLER_ALLOW_PRIVATE_TARGETS="true",
        POLLER_RETRY_SCHEDULE="[0.2]",
        POLLER_CIRCUIT_FAILURES="0" if mode == "off" else "10",
    )
    poller = Proc(["run", "--id", f"health-{mode}"], env, tmp / f"poller-{mode}.log")
    try:
        poller.wait_for("starting")
        if mode != "alone":
            dead = [Message("dead", "e", {"n": i}, f"dead:{i}") for i in range(args.dead)]
            drain_dead = time.monotonic() + 3.0  # let the dead backlog get going
            with Session(engine) as session, session.begin():
                enqueue_many(session, dead)
            while time.monotonic() < drain_dead:  # a warm-up, not synchronisation
                time.sleep(0.1)
        before = _attempts_to_dead(engine)
        batch = [
            # keys differ per round: the receiver dedupes, and it serves every round
            Message("bench", "bench.event", _payload(i), f"{mode}:{n}:{i}")
            for i in range(args.messages)
        ]
        rate = drain(engine, receiver_url, batch, timeout=args.timeout)
        wasted = _attempts_to_dead(engine) - before
    finally:
        poller.stop()
        engine.dispose()
    return rate, wasted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--dead", type=int, default=5_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--logs", help="keep the processes' logs in this folder")
    args = parser.parse_args()
    secret = new_secret()
    figures: dict[str, list[tuple[float, int]]] = {"alone": [], "off": [], "on": []}
    with tempfile.TemporaryDirectory(prefix="poller-health-") as tmpdir, server_url() as admin:
        tmp = Path(args.logs) if args.logs else Path(tmpdir)
        tmp.mkdir(parents=True, exist_ok=True)
        receiver, receiver_url = start_receiver(tmp, secret, "receiver")
        try:
            for n in range(args.rounds):
                for mode in figures:
                    figures[mode].append(one_round(admin, tmp, receiver_url, secret, mode, n, args))
        finally:
            receiver.stop()
    alone = statistics.median(r for r, _ in figures["alone"])
    print(f"{'configuration':32} {'deliveries/s':>13} {'ratio':>6} {'sent to dead':>13}")
    labels = {
        "alone": "healthy endpoint alone",
        "off": "beside a dead one, breaker off",
        "on": "beside a dead one, breaker on",
    }
    for mode, runs in figures.items():
        rate = statistics.median(r for r, _ in runs)
        wasted = statistics.median(w for _, w in runs)
        print(f"{labels[mode]:32} {rate:>13,.0f} {rate / alone:>6.2f} {wasted:>13,.0f}")


if __name__ == "__main__":
    main()
