"""The poller's own CPU per delivery, with and without the wire.

    python -m loadtest.overhead [--messages 20000] [--rounds 3] [--concurrency 64]
                                [--wire] [--keys 1000]

The service of `poller run` runs in this process (on uvloop), so a profiler
sees only it (``py-spy record -- python -m loadtest.overhead``). Each round
commits ``--messages`` at once from a driver thread and waits until all are
delivered; the figure is the CPU of every thread but the driver's, per
delivery, median of ``--rounds``, with each thread's share (user and system)
and how many messages a claim and outcomes a completion took.

Without ``--wire`` the sender answers 200 at once and sends nothing: what is
left is the poller's own work (claims, each delivery's task, signing, outcomes,
completions, metrics). With it, requests go through the configured client
(POLLER_HTTP_CLIENT) to the signature-checking receiver, another process.
PostgreSQL is another process too, and is not counted. With ``--keys`` the
messages are ordered, spread over that many ordering keys: what handing keys on
costs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import REGISTRY

from loadtest.bench_db import fresh_database, server_url
from loadtest.deliveries import drain, start_receiver
from poller.cli import run as cli_run
from poller.deliver import sending
from poller.deliver.wire import Reply
from poller.endpoints.registry import create_endpoint, new_secret
from poller.rows.claims import Claims
from poller.settings import load_settings
from poller.store.db import sync_engine

if TYPE_CHECKING:
    from poller.endpoints.tls import TLSSettings

OK = Reply(200, None, b"")


class AnswerAtOnce:
    """A sender that sends nothing: every request is answered 200 without I/O."""

    async def request(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        body: bytes,
        timeout: float,
        tls: TLSSettings | None = None,
    ) -> Reply:
        return OK

    async def aclose(self) -> None:
        pass


def _threads_cpu(but: int) -> dict[str, float]:
    """CPU seconds of this process's threads by name, all but thread ``but`` (/proc/self/task)."""
    by_name: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        if int(tid) == but:
            continue
        try:
            stat = Path(f"/proc/self/task/{tid}/stat").read_text()
        except OSError:  # the thread ended
            continue
        name, _, rest = stat.partition("(")[2].rpartition(")")
        fields = rest.split()
        tick = os.sysconf("SC_CLK_TCK")
        for kind, used in (("", int(fields[11]) / tick), (" sys", int(fields[12]) / tick)):
            by_name[name + kind] = by_name.get(name + kind, 0.0) + used
    return by_name


COMPLETIONS = [0]  # completion statements so far


def _claims() -> float:
    return REGISTRY.get_sample_value("webhook_poller_claim_duration_seconds_count") or 0.0


def _counting(complete: Any) -> Any:
    async def counted(self: Claims, outcomes: Any) -> Any:
        if outcomes:
            COMPLETIONS[0] += 1
        return await complete(self, outcomes)

    return counted


def _setup(args: argparse.Namespace, url: str, target: str, secret: str) -> None:
    engine = sync_engine(url)
    with engine.begin() as conn:
        create_endpoint(
            conn,
            "bench",
            target,
            secret=secret,
            max_in_flight=args.concurrency,
            allow_private=True,
            event_types=["order.*"],
        )
    engine.dispose()


def _rounds(args: argparse.Namespace, url: str) -> list[tuple[float, float]]:
    """The driver (its own thread): commit, wait for the deliveries; CPU of the others."""
    me = threading.get_native_id()
    engine = sync_engine(url)
    try:
        drain(engine, 2_000, args.timeout, "warm")  # warm-up: caches, prepared statements
        figures = []
        for n in range(args.rounds):
            cpu, claims, completions = _threads_cpu(but=me), _claims(), COMPLETIONS[0]
            rate = drain(engine, args.messages, args.timeout, f"round{n}", keys=args.keys)
            after = _threads_cpu(but=me)
            threads = {k: v - cpu.get(k, 0.0) for k, v in after.items()}
            used = sum(threads.values())
            claims, completions = _claims() - claims, COMPLETIONS[0] - completions
            figures.append((used / args.messages * 1e6, rate))
            shares = ", ".join(
                f"{k} {v / args.messages * 1e6:.0f}" for k, v in threads.items() if v > 0.005
            )
            print(
                f"round {n}: {figures[-1][0]:.0f} µs of CPU per delivery ({shares}), "
                f"{rate:,.0f}/s; "
                f"{args.messages / max(claims, 1):.0f} messages per claim, "
                f"{args.messages / max(completions, 1):.0f} outcomes per completion"
            )
        return figures
    finally:
        engine.dispose()


async def _measured(args: argparse.Namespace, url: str) -> list[tuple[float, float]]:
    """`poller run`'s service on this loop while the driver runs; then a graceful stop."""
    service = asyncio.create_task(cli_run.run_service(load_settings(), url, "overhead"))
    try:
        return await asyncio.to_thread(_rounds, args, url)
    finally:
        os.kill(os.getpid(), signal.SIGTERM)  # run_service's own graceful stop
        await service


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--keys", type=int, default=0, help="ordered: the messages over this many ordering keys"
    )
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument(
        "--wire",
        action="store_true",
        help="send for real (POLLER_HTTP_CLIENT) to the signature-checking receiver",
    )
    args = parser.parse_args()
    secret = new_secret()
    with tempfile.TemporaryDirectory(prefix="poller-overhead-") as tmp, server_url() as admin:
        url = fresh_database(admin, "poller_overhead")
        receiver = None
        target = "http://127.0.0.1:9/bench"
        if args.wire:
            receiver, receiver_url = start_receiver(Path(tmp), secret, "receiver")
            target = f"{receiver_url}/bench"
        _setup(args, url, target, secret)
        os.environ.update(
            POLLER_DATABASE_URL=url,
            POLLER_CONCURRENCY=str(args.concurrency),
            POLLER_BATCH_SIZE="100",
            POLLER_ALLOW_PRIVATE_TARGETS="true",
            POLLER_METRICS_ADDR="127.0.0.1:0",
        )
        Claims.complete = _counting(Claims.complete)  # type: ignore[method-assign]
        if not args.wire:
            # where `poller run` gets its sender (it imports poller.deliver.sending when it starts)
            sending.make_sender = lambda _settings: AnswerAtOnce()  # type: ignore[assignment,return-value]
        try:
            figures = cli_run.event_loop_run(_measured(args, url))
        finally:
            if receiver is not None:
                receiver.stop()
        print(
            f"median: {statistics.median(f[0] for f in figures):.1f} µs of the poller's CPU "
            f"per delivery ({statistics.median(f[1] for f in figures):,.0f}/s; "
            f"{args.messages:,} messages × {args.rounds}; "
            + ("sent by the poller's HTTP client)" if args.wire else "no request sent)")
        )


if __name__ == "__main__":
    main()
