"""What tracing costs a drain: `poller run` delivering messages enqueued inside a span, with
tracing off, exporting to a collector, and exporting to a collector that is down or never
answers. Deliveries per CPU second of the poller, each against tracing off in the same
run (a benchmark: it prints figures). The machine's noise is as large as what is
measured, so the modes run in ``--rounds`` interleaved rounds, each in another order,
and each figure is the median of its rounds.

    python -m loadtest.tracing_bench --messages 10000 --rounds 3
"""

from __future__ import annotations

import argparse
import contextlib
import random
import socket
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from sqlalchemy import text
from sqlalchemy.orm import Session

from loadtest.bench_db import fresh_database, server_url
from loadtest.deliveries import cpu_seconds, start_receiver
from loadtest.otlp_sink import Sink
from loadtest.procs import Proc, clean_env
from poller import Message, enqueue_many
from poller.db import sync_engine
from poller.endpoints import create_endpoint, new_secret


def closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def _enqueue_in_spans(engine: Any, messages: int, prefix: str) -> None:
    rng = random.Random(7)
    for start in range(0, messages, 500):
        span = NonRecordingSpan(
            SpanContext(rng.getrandbits(128), rng.getrandbits(64) | 1, False, TraceFlags(1))
        )
        batch = [Message("bench", "order.created", {"n": n}, f"{prefix}:{n}")
                 for n in range(start, min(messages, start + 500))]  # fmt: skip
        with trace.use_span(span), Session(engine) as session, session.begin():
            enqueue_many(session, batch)


def _delivered(engine: Any) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                text("SELECT count(*) FROM poller_outbox WHERE status = 'delivered'")
            ).scalar_one()
        )


def drain(tmp: Path, engine: Any, url: str, mode: str, otel: dict[str, str], messages: int
          ) -> tuple[float, float]:  # fmt: skip
    """Deliveries/s and deliveries per poller CPU second of one drain in ``mode``."""
    poller = Proc(
        ["run", "--id", f"trace-{mode.replace(' ', '-')}"],
        clean_env(
            POLLER_DATABASE_URL=url,
            POLLER_CONCURRENCY="64",
            POLLER_BATCH_SIZE="100",
            POLLER_ALLOW_PRIVATE_TARGETS="true",
            **otel,
        ),
        tmp / f"poller-{mode}.log",
    )
    try:
        poller.wait_for("starting")
        time.sleep(1.0)  # a benchmark warm-up, not synchronisation: the poller already runs
        already = _delivered(engine)
        _enqueue_in_spans(engine, messages, mode.replace(" ", "-"))
        cpu, began = cpu_seconds(poller.popen.pid), time.perf_counter()
        while _delivered(engine) < already + messages:
            time.sleep(0.02)
        elapsed = time.perf_counter() - began
        return messages / elapsed, messages / (cpu_seconds(poller.popen.pid) - cpu)
    finally:
        poller.stop()


@contextlib.contextmanager
def modes() -> Iterator[list[tuple[str, dict[str, str]]]]:
    with Sink() as collector, Sink(hang=True) as hanging:
        base = {"OTEL_SERVICE_NAME": "bench", "OTEL_EXPORTER_OTLP_TIMEOUT": "2"}
        yield [
            ("off", {}),
            ("collector", {**base, "OTEL_EXPORTER_OTLP_ENDPOINT": collector}),
            ("dead collector", {**base, "OTEL_EXPORTER_OTLP_ENDPOINT": closed_port()}),
            ("hanging collector", {**base, "OTEL_EXPORTER_OTLP_ENDPOINT": hanging}),
        ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    secret = new_secret()
    with (
        tempfile.TemporaryDirectory(prefix="poller-trace-bench-") as tmp_name,
        server_url() as admin,
    ):
        tmp = Path(tmp_name)
        url = fresh_database(admin, "poller_bench_tracing")
        receiver, receiver_url = start_receiver(tmp, secret, "receiver")
        engine = sync_engine(url)
        try:
            with engine.begin() as conn:
                create_endpoint(conn, "bench", f"{receiver_url}/bench", secret=secret,
                                max_in_flight=64, allow_private=True)  # fmt: skip
            results: dict[str, list[tuple[float, float]]] = {}
            with modes() as runs:
                for round_ in range(args.rounds):
                    turn = round_ % len(runs)
                    for n, (mode, otel) in enumerate(runs[turn:] + runs[:turn]):
                        name = f"{mode} {round_}-{n}"
                        got = drain(tmp, engine, url, name, otel, args.messages)
                        results.setdefault(mode, []).append(got)
            rate = {m: statistics.median(r for r, _ in got) for m, got in results.items()}
            per_cpu = {m: statistics.median(c for _, c in got) for m, got in results.items()}
            print(f"tracing and the drain of {args.messages:,} messages enqueued in spans, "
                  f"medians of {args.rounds} interleaved rounds (deliveries/s, per poller "
                  "CPU second, against off):")  # fmt: skip
            for mode in results:
                print(f"  {mode:>18}: {rate[mode]:7,.0f}/s  {per_cpu[mode]:7,.0f} per CPU s  "
                      f"{per_cpu[mode] / per_cpu['off']:5.2f}")  # fmt: skip
        finally:
            receiver.stop()
            engine.dispose()


if __name__ == "__main__":
    main()
