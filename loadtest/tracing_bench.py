"""What tracing costs a drain: `poller run` delivering messages enqueued inside a span, with
tracing off, exporting to a collector, and exporting to a collector that is down or never
answers; and, tracing off, messages enqueued outside any span (what carrying a stored
context to the receiver costs when tracing is off). Deliveries per CPU second of the
poller, against tracing off in the same run (a benchmark: it prints figures).

**Paired.** This machine's noise (±20 % from one drain to the next) is larger than what
is measured, so each mode runs *beside* a poller with tracing off, at the same time,
each draining its own database into the same receiver: whatever slows the machine
slows both. Each pair's figure is its mode's deliveries per CPU second over the
window both were draining, divided by its off poller's; the figures are medians of
``--rounds`` pairs. ``off`` against ``off`` shows what the method itself scatters.

    python -m loadtest.tracing_bench --messages 8000 --rounds 8
"""

from __future__ import annotations

import argparse
import contextlib
import random
import re
import socket
import statistics
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import INVALID_SPAN, NonRecordingSpan, SpanContext, TraceFlags
from sqlalchemy import text
from sqlalchemy.orm import Session

from loadtest.bench_db import fresh_database, server_url
from loadtest.deliveries import cpu_seconds, start_receiver
from loadtest.otlp_sink import Sink
from loadtest.procs import Proc, clean_env
from poller import Message, enqueue_many
from poller.endpoints.registry import create_endpoint, new_secret
from poller.store.db import sync_engine

CHUNK = 500  # messages a transaction (each in its own span)
WINDOW_ENDS = 0.9  # the window closes when either side has delivered this share


def closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def _slug(text_: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text_.lower()).strip("-")


@dataclass
class Side:
    """A database with its endpoint, drained by one poller of a pair."""

    url: str
    engine: Any
    in_spans: bool = True

    def enqueue(self, start: int, count: int, prefix: str, rng: random.Random) -> None:
        span = NonRecordingSpan(
            SpanContext(rng.getrandbits(128), rng.getrandbits(64) | 1, False, TraceFlags(1))
        )
        batch = [Message("bench", "order.created", {"n": n}, f"{prefix}:{n}")
                 for n in range(start, start + count)]  # fmt: skip
        with (
            trace.use_span(span if self.in_spans else INVALID_SPAN),
            Session(self.engine) as session,
            session.begin(),
        ):
            enqueue_many(session, batch)

    def delivered(self) -> int:
        with self.engine.connect() as conn:
            return int(
                conn.execute(
                    text("SELECT count(*) FROM poller_outbox WHERE status = 'delivered'")
                ).scalar_one()
            )

    def empty(self) -> None:
        with self.engine.begin() as conn:
            conn.execute(text("TRUNCATE poller_outbox CASCADE"))


def _poller(tmp: Path, side: Side, name: str, otel: dict[str, str]) -> Proc:
    env = clean_env(
        POLLER_DATABASE_URL=side.url,
        POLLER_CONCURRENCY="64",
        POLLER_BATCH_SIZE="100",
        POLLER_ALLOW_PRIVATE_TARGETS="true",
        **otel,
    )
    return Proc(["run", "--id", _slug(name)], env, tmp / f"poller-{_slug(name)}.log")


def pair(tmp: Path, sides: tuple[Side, Side], otel: tuple[dict[str, str], dict[str, str]],
         messages: int, label: str, *, second_first: bool = False,
         ) -> tuple[tuple[float, float], tuple[float, float]]:  # fmt: skip
    """Two pollers draining ``messages`` each at the same time, one a side: each one's
    deliveries/s and deliveries per CPU second over the window both were draining.
    ``second_first``: the second side's poller starts, and gets each chunk, first."""
    for side in sides:
        side.empty()
    order = [1, 0] if second_first else [0, 1]
    pollers: list[Proc | None] = [None, None]
    try:
        for n in order:
            pollers[n] = _poller(tmp, sides[n], f"{label}-{n}", otel[n])
        started = [p for p in pollers if p is not None]
        for poller in started:
            poller.wait_for("starting")
        time.sleep(1.0)  # a benchmark warm-up, not synchronisation: both already run
        rng = random.Random(7)
        for start in range(0, messages, CHUNK):  # side by side, so both start together
            for n in order:
                count = min(CHUNK, messages - start)
                sides[n].enqueue(start, count, _slug(f"{label}-{n}"), rng)
        began = time.perf_counter()
        cpu = [cpu_seconds(p.popen.pid) for p in started]
        done = [side.delivered() for side in sides]
        while True:
            now = [side.delivered() for side in sides]
            if max(now) >= messages * WINDOW_ENDS:
                break
            time.sleep(0.02)
        elapsed = time.perf_counter() - began
        used = [cpu_seconds(p.popen.pid) - c for p, c in zip(started, cpu, strict=True)]
        got = [n - d for n, d in zip(now, done, strict=True)]
        first, second = ((g / elapsed, g / u) for g, u in zip(got, used, strict=True))
        return first, second
    finally:
        for each in pollers:
            if each is not None:
                each.stop()


@contextlib.contextmanager
def modes() -> Iterator[list[tuple[str, dict[str, str], bool]]]:
    """Each mode: its name, its tracing variables, whether its messages carry a context."""
    with Sink() as collector, Sink(hang=True) as hanging:
        base = {"OTEL_SERVICE_NAME": "bench", "OTEL_EXPORTER_OTLP_TIMEOUT": "2"}
        yield [
            ("off", {}, True),  # against off: what the method scatters
            ("off, no context", {}, False),  # outside any span: nothing stored, nothing sent
            ("collector", {**base, "OTEL_EXPORTER_OTLP_ENDPOINT": collector}, True),
            ("dead collector", {**base, "OTEL_EXPORTER_OTLP_ENDPOINT": closed_port()}, True),
            ("hanging collector", {**base, "OTEL_EXPORTER_OTLP_ENDPOINT": hanging}, True),
        ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=8_000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--only", help="these modes alone, comma-separated (collector,off)")
    args = parser.parse_args()
    secret = new_secret()
    with (
        tempfile.TemporaryDirectory(prefix="poller-trace-bench-") as tmp_name,
        server_url() as admin,
    ):
        tmp = Path(tmp_name)
        receiver, receiver_url = start_receiver(tmp, secret, "receiver")
        sides: list[Side] = []
        try:
            for n in range(2):
                url = fresh_database(admin, f"poller_bench_tracing_{n}")
                sides.append(Side(url, sync_engine(url)))
                with sides[-1].engine.begin() as conn:
                    create_endpoint(conn, "bench", f"{receiver_url}/bench", secret=secret,
                                    max_in_flight=64, allow_private=True)  # fmt: skip
            ratios: dict[str, list[float]] = {}
            rates: dict[str, list[float]] = {}
            with modes() as every:
                only = set(args.only.split(",")) if args.only else None
                runs = [run for run in every if only is None or run[0] in only]
                for round_ in range(args.rounds):
                    for mode, otel, in_spans in runs:
                        # every fourth round, each database has served each role and each
                        # role has started first
                        flip, second_first = round_ % 2 == 1, round_ // 2 % 2 == 1
                        base, other = (sides[1], sides[0]) if flip else (sides[0], sides[1])
                        base.in_spans, other.in_spans = True, in_spans
                        label = f"{mode} {round_}"
                        off, this = pair(tmp, (base, other), ({}, otel), args.messages, label,
                                         second_first=second_first)  # fmt: skip
                        ratios.setdefault(mode, []).append(this[1] / off[1])
                        rates.setdefault(mode, []).append(this[1])
                        rates.setdefault("off (beside)", []).append(off[1])
            print(f"tracing and a drain of {args.messages:,} messages, each mode beside a "
                  f"poller with tracing off; medians of {args.rounds} pairs:")  # fmt: skip
            print(f"  {'off (every pair)':>18}: {statistics.median(rates['off (beside)']):7,.0f} "
                  "per CPU s")  # fmt: skip
            for mode, got in ratios.items():
                spread = f"{min(got):.2f}–{max(got):.2f}"
                print(f"  {mode:>18}: {statistics.median(rates[mode]):7,.0f} per CPU s  against "
                      f"off beside it {statistics.median(got):5.2f} ({spread})")  # fmt: skip
        finally:
            receiver.stop()
            for side in sides:
                side.engine.dispose()


if __name__ == "__main__":
    main()
