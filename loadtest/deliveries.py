"""Deliveries/s of one `poller run` process, beside the raw HTTP ceiling, same run.

    python -m loadtest.deliveries [--messages 20000] [--concurrency 64] [--publish]
                                  [--processes 1,2] [--latency 0.1] [--rounds 3]

1. raw ceiling: aiohttp and pyreqwest (--concurrency in flight) each POST the
   same payloads to the reference receiver;
2. drain: --messages are committed in one go while one `poller run` process
   idles, and the time until all are delivered gives deliveries/s; once per
   client of --clients;
   1 and 2 run --rounds times, interleaved (each round's figures are printed),
   and the tables take each figure's median: this shared machine's speed moves
   within a run, and one sample of each swung the ratios by a fifth;
3. latency: messages are enqueued at half the median drain rate for --seconds
   (in transactions of 10); commit→receipt is each key's time at the receiver
   (its /receipts) minus the time its transaction's COMMIT returned.

4. with ``--processes 1,2``: drains spread over 16 endpoints (2 per shard: a
   shard, so an endpoint, is served by one process) by `poller run
   --processes N` for each N, each child with --concurrency in flight,
   against the one-process rate.

With --latency the receiver answers each request after that many seconds,
so both sides are bound by requests in flight rather than CPU (how a change
to claim batching treats slow receivers).

With --idle-endpoints N the database first gets N more endpoints that never
have a message (a product whose customers each registered one): the claims
must not pay for them.

With --publish the messages are published events (poller.publish_many) to the
endpoint's subscription instead of enqueued: the claim then reads each payload
from its event.

Everything runs on this machine: PostgreSQL (embedded unless
POLLER_DATABASE_URL), the receiver and the poller, each its own process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import resource
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import uvloop
from sqlalchemy import text
from sqlalchemy.orm import Session

from loadtest.bench_db import fresh_database, server_url
from loadtest.procs import Proc, clean_env, tree_cpu_seconds
from poller import Event, Message, enqueue_many, publish_many
from poller.endpoints.registry import create_endpoint, new_secret, update_endpoint
from poller.store.db import sync_engine
from poller.store.schema import BUCKETS, endpoints

PAD = "x" * 200


def _payload(n: int) -> dict[str, Any]:
    return {"order": n, "pad": PAD, "enqueued_at": time.time()}


def start_receiver(tmp: Path, secret: str, name: str, latency: float = 0.0) -> tuple[Proc, str]:
    """The reference receiver on a free port; ``latency``: seconds it takes per request."""
    flags = ["--latency", str(latency)] if latency else []
    proc = Proc(
        ["receiver", "--port", "0", "--secret", secret, *flags], clean_env(), tmp / f"{name}.log"
    )
    port = proc.wait_for(r"listening on http://127\.0\.0\.1:(\d+)").group(1)
    return proc, f"http://127.0.0.1:{port}"


def start_poller(
    tmp: Path,
    engine: Any,
    url: str,
    receiver_url: str,
    secret: str,
    concurrency: int,
    processes: int = 1,
    http_client: str | None = None,
    name: str = "poller",
) -> Proc:
    """The endpoint "bench" on the receiver (made once), and `poller run` (with
    ``processes`` children) with ``concurrency`` deliveries in flight each, started
    and past its first second; its output in ``name``.log, which must be new (the
    start is read from it)."""
    with engine.begin() as conn:
        if not conn.execute(text("SELECT 1 FROM poller_endpoints WHERE name = 'bench'")).first():
            create_endpoint(
                conn,
                "bench",
                f"{receiver_url}/bench",
                secret=secret,
                max_in_flight=concurrency,
                allow_private=True,
                event_types=["order.*"],
            )
    poller = Proc(
        ["run", "--id", f"bench{processes}", "--processes", str(processes)],
        clean_env(
            POLLER_DATABASE_URL=url,
            POLLER_CONCURRENCY=str(concurrency),
            POLLER_ALLOW_PRIVATE_TARGETS="true",
            POLLER_BATCH_SIZE="100",
            **({"POLLER_HTTP_CLIENT": http_client} if http_client else {}),
        ),
        tmp / f"{name}.log",
    )
    try:
        poller.wait_for("starting")
    except BaseException:
        poller.stop()  # the caller never got it to stop
        raise
    time.sleep(1.0)  # a benchmark warm-up, not synchronisation: the poller already runs
    return poller


def add_idle_endpoints(engine: Any, count: int) -> None:
    """``count`` endpoints over every bucket, subscribed to no event the benchmark
    publishes, that never get a message (copies of one, made through the API)."""
    if count <= 0:
        return
    with engine.begin() as conn:
        create_endpoint(
            conn, "idle-0", "http://127.0.0.1:9/idle", allow_private=True, event_types=["idle.*"]
        )
        columns = ", ".join(
            c.name for c in endpoints.columns if c.name not in ("id", "name", "bucket")
        )
        conn.execute(
            text(
                f"INSERT INTO poller_endpoints (name, bucket, {columns})"
                f" SELECT 'idle-' || g, CAST(g % {BUCKETS} AS smallint), {columns}"
                " FROM poller_endpoints, generate_series(1, :n) AS g"
            ),
            {"n": count - 1},
        )
        conn.execute(text("ANALYZE"))


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def raw_ceiling(
    url: str, messages: int, concurrency: int, secret: str, client: str = "aiohttp"
) -> tuple[float, float]:
    """Requests/s of a plain client (``aiohttp`` or ``pyreqwest``) POSTing signed payloads,
    ``concurrency`` in flight, and the CPU seconds this process spent doing it (every
    thread: pyreqwest's runtime included)."""
    from poller.rules.signing import sign

    bodies = [json.dumps(_payload(n)).encode() for n in range(messages)]
    queue: asyncio.Queue[int] = asyncio.Queue()
    for n in range(messages):
        queue.put_nowait(n)

    def signed(n: int) -> dict[str, str]:
        stamp = int(time.time())
        return {
            "webhook-id": f"raw:{n}",
            "webhook-timestamp": str(stamp),
            "webhook-signature": sign([secret], f"raw:{n}", stamp, bodies[n]),
            "Content-Type": "application/json",
        }

    if client == "pyreqwest":
        from pyreqwest.client import ClientBuilder

        rq = ClientBuilder().max_connections(concurrency).build()

        async def post(n: int) -> int:
            answer = (
                await rq.post(f"{url}/raw").headers(signed(n)).body_bytes(bodies[n]).build().send()
            )
            await answer.bytes()
            return answer.status

        close: Callable[[], Any] = rq.close
    else:
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency))

        async def post(n: int) -> int:
            async with session.post(f"{url}/raw", data=bodies[n], headers=signed(n)) as resp:
                await resp.read()
                return resp.status

        close = session.close

    async def worker() -> None:
        while not queue.empty():
            status = await post(queue.get_nowait())
            assert status == 200, status

    began, cpu = time.perf_counter(), _cpu()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    rate, used = messages / (time.perf_counter() - began), _cpu() - cpu
    await close()
    return rate, used


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _delivered(engine: Any) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                text("SELECT count(*) FROM poller_outbox WHERE status = 'delivered'")
            ).scalar_one()
        )


def _outstanding(engine: Any) -> bool:
    """Whether any message waits or is in flight: two probes of partial indexes, where
    counting the delivered rows every 20 ms read the whole table (5 ms of PostgreSQL's
    CPU each over 20,000 rows: a quarter of a core taken from the drain it measured)."""
    with engine.connect() as conn:
        return bool(
            conn.execute(
                text(
                    "SELECT EXISTS (SELECT 1 FROM poller_outbox WHERE status = 'pending')"
                    " OR EXISTS (SELECT 1 FROM poller_outbox WHERE status = 'in_flight')"
                )
            ).scalar_one()
        )


def wait_delivered(engine: Any, expected: int, timeout: float, what: str) -> None:
    """Until nothing is pending or in flight; then ``expected`` rows must be delivered."""
    deadline = time.monotonic() + timeout
    while _outstanding(engine):
        if time.monotonic() > deadline:
            raise SystemExit(f"{what}: only {_delivered(engine)} of {expected} delivered")
        time.sleep(0.02)
    if (delivered := _delivered(engine)) < expected:
        raise SystemExit(f"{what}: {delivered} of {expected} delivered, the rest failed")


def wal_bytes(engine: Any) -> int:
    """PostgreSQL's WAL position in bytes."""
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT pg_current_wal_lsn() - '0/0'")).scalar_one())


def postgres_pid(engine: Any) -> int | None:
    """The postmaster's PID when the server runs on this machine (a backend's parent)."""
    with engine.connect() as conn:
        backend = int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())
    try:
        return int(Path(f"/proc/{backend}/stat").read_text().rpartition(")")[2].split()[1])
    except OSError:
        return None


def _commit(session: Session, batch: list[Message]) -> None:
    """Enqueue the batch, or publish it as events (--publish) to the same endpoint."""
    if PUBLISH:
        publish_many(session, [Event(m.event_type, m.payload, m.idempotency_key) for m in batch])
    else:
        enqueue_many(session, batch)


PUBLISH = False


def drain(
    engine: Any,
    messages: int,
    timeout: float,
    prefix: str = "drain",
    on_committed: Callable[[], object] = lambda: None,
    keys: int = 0,
) -> float:
    """Commit ``messages`` at once; deliveries/s until all are delivered. ``keys``: that
    many ordering keys, the messages spread over them in turn (0: unordered)."""
    batch = [
        Message(
            "bench",
            "order.created",
            _payload(n),
            f"{prefix}:{n}",
            ordering_key=f"k{n % keys}" if keys else None,
        )
        for n in range(messages)
    ]
    already = _delivered(engine)
    with Session(engine) as session, session.begin():
        _commit(session, batch)
    on_committed()
    began = time.perf_counter()
    wait_delivered(engine, already + messages, timeout, "drain")
    return messages / (time.perf_counter() - began)


def paced(engine: Any, rate: float, seconds: float, timeout: float) -> dict[str, float]:
    """Enqueue at ``rate`` messages/s in transactions of 10 for ``seconds``; wait for delivery.

    Returns each key's commit time (epoch seconds, taken right after COMMIT).
    """
    already = _delivered(engine)
    per_tx = 10
    sent = 0
    committed: dict[str, float] = {}
    began = time.monotonic()
    while time.monotonic() - began < seconds:
        target = int((time.monotonic() - began) * rate)
        while sent + per_tx <= target:
            batch = [
                Message("bench", "order.created", _payload(n), f"paced:{n}")
                for n in range(sent, sent + per_tx)
            ]
            with Session(engine) as session, session.begin():
                _commit(session, batch)
            done = time.time()
            committed.update((m.idempotency_key, done) for m in batch)
            sent += per_tx
        time.sleep(0.002)
    wait_delivered(engine, already + sent, timeout, "paced")
    return committed


def _balanced_names(per_shard: int, shards: int = 8) -> list[str]:
    """Endpoint names whose buckets fill each of ``shards`` shards ``per_shard`` times."""
    from poller.endpoints.registry import bucket_for

    names: list[str] = []
    taken = [0] * shards
    n = 0
    while len(names) < per_shard * shards:
        name = f"spread-{n}"
        shard = bucket_for(name) % shards
        if taken[shard] < per_shard:
            taken[shard] += 1
            names.append(name)
        n += 1
    return names


_LEADING = re.compile(r'"message": "shard (\d+): (leading|released)[^"]*", "poller": "([^"]+)"')


def balanced(poller: Proc, processes: int, shards: int = 8, timeout: float = 60.0) -> None:
    """Wait until ``processes`` children lead the ``shards`` between them, none more than
    its share: a drain that starts while one child holds every shard and hands half of
    them over measured the hand-over (a few seconds), not the processes."""
    share = -(-shards // processes)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        leaders: dict[int, str] = {}
        for shard, what, who in _LEADING.findall(poller.output()):
            if what == "leading":
                leaders[int(shard)] = who
            elif leaders.get(int(shard)) == who:
                del leaders[int(shard)]
        held = list(leaders.values())
        if len(leaders) == shards and max(held.count(w) for w in set(held)) <= share:
            return
        time.sleep(0.1)
    raise SystemExit(f"spread: {processes} processes did not share the {shards} shards")


def spread(
    tmp: Path,
    engine: Any,
    url: str,
    receiver_url: str,
    secret: str,
    args: argparse.Namespace,
    counts: list[int],
    procs: list[Proc],
) -> list[str]:
    """Drains over 16 endpoints (2 per shard) by `poller run --processes N` for each N."""
    if len(counts) < 2:
        return []
    names = _balanced_names(2)
    with engine.begin() as conn:
        for name in names:
            create_endpoint(
                conn, name, f"{receiver_url}/{name}", secret=secret,
                max_in_flight=args.concurrency, allow_private=True,
            )  # fmt: skip
    lines, first = [], 0.0
    for count in counts:
        poller = start_poller(
            tmp, engine, url, receiver_url, secret, args.concurrency, count, name=f"spread-{count}"
        )
        procs.append(poller)
        try:
            balanced(poller, count)
            batch = [
                Message(names[n % len(names)], "order.created", _payload(n), f"spread{count}:{n}")
                for n in range(args.messages)
            ]
            already = _delivered(engine)
            cpu = tree_cpu_seconds(poller.popen.pid)
            with Session(engine) as session, session.begin():
                enqueue_many(session, batch)
            began = time.perf_counter()
            wait_delivered(engine, already + args.messages, args.timeout, "spread")
            rate = args.messages / (time.perf_counter() - began)
            used = tree_cpu_seconds(poller.popen.pid) - cpu
        finally:
            poller.stop()
        first = first or rate
        lines.append(
            f"--processes {count}, 16 endpoints: {rate:,.0f} deliveries/s = {rate / first:.2f}x "
            f"one process; {args.messages / used:,.0f} per CPU second of the poller's processes"
        )
    return lines


def percentiles(committed: dict[str, float], receipts: dict[str, float]) -> tuple[float, float]:
    """p50 and p99 of commit→receipt in ms (clock of one machine: both sides use time.time())."""
    ordered = sorted((receipts[k] - t) * 1000 for k, t in committed.items())
    return ordered[len(ordered) // 2], ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=10.0, help="paced phase length")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="interleaved rounds of the raw clients and the drains; the tables take medians",
    )
    parser.add_argument("--publish", action="store_true", help="publish events, not enqueue")
    parser.add_argument(
        "--idle-endpoints", type=int, default=0, help="endpoints that never get a message"
    )
    parser.add_argument(
        "--latency",
        type=float,
        default=0.0,
        help="seconds the receiver takes per request (a slow receiver: in-flight bound)",
    )
    parser.add_argument(
        "--processes",
        default="1",
        help="comma-separated `poller run --processes` counts; each after the first drains "
        "again and is compared with one process",
    )
    parser.add_argument(
        "--clients",
        default="reqwest,aiohttp",
        help="comma-separated POLLER_HTTP_CLIENT values to drain with, the default first "
        "(the latency phase and --processes use the first)",
    )
    args = parser.parse_args()
    global PUBLISH
    PUBLISH = args.publish
    secret = new_secret()
    clients = args.clients.split(",")
    # client -> each round's (requests/s, per CPU s); POLLER_HTTP_CLIENT -> (deliveries/s, ...)
    raw: dict[str, list[tuple[float, float]]] = {"aiohttp": [], "pyreqwest": []}
    drains: dict[str, list[tuple[float, float]]] = {client: [] for client in clients}
    database = ""
    with tempfile.TemporaryDirectory(prefix="poller-bench-") as tmp_name, server_url() as admin:
        tmp = Path(tmp_name)
        url = fresh_database(admin, "poller_bench_deliveries")
        engine = sync_engine(url)
        add_idle_endpoints(engine, args.idle_endpoints)
        procs: list[Proc] = []
        try:
            for round_ in range(args.rounds):
                for client in raw:
                    receiver, receiver_url = start_receiver(
                        tmp, secret, f"raw-{client}-{round_}", args.latency
                    )
                    procs.append(receiver)
                    rate, used = uvloop.run(
                        raw_ceiling(receiver_url, args.messages, args.concurrency, secret, client)
                    )
                    raw[client].append((rate, args.messages / used))
                    receiver.stop()
                for client in clients:
                    receiver, receiver_url = start_receiver(
                        tmp, secret, f"drain-{client}-{round_}", args.latency
                    )
                    procs.append(receiver)
                    with engine.begin() as conn:  # the next claim sees the change and reloads it
                        if drains[clients[0]]:
                            update_endpoint(
                                conn, "bench", url=f"{receiver_url}/bench", allow_private=True
                            )
                    poller = start_poller(
                        tmp,
                        engine,
                        url,
                        receiver_url,
                        secret,
                        args.concurrency,
                        http_client=client,
                        name=f"poller-{client}-{round_}",
                    )
                    procs.append(poller)
                    rate, per_cpu, database_use = measured_drain(
                        engine,
                        poller.popen.pid,
                        args.messages,
                        args.timeout,
                        f"drain-{client}-{round_}",
                    )
                    drains[client].append((rate, per_cpu))
                    database = database or database_use
                    receiver.stop()
                    poller.stop()
                print(_round_line(round_, raw, drains), flush=True)
            # the latency at half the default client's median drain rate
            half = _median(drains[clients[0]])[0] / 2
            receiver, receiver_url2 = start_receiver(tmp, secret, "paced", args.latency)
            procs.append(receiver)
            with engine.begin() as conn:
                update_endpoint(conn, "bench", url=f"{receiver_url2}/bench", allow_private=True)
            poller = start_poller(
                tmp,
                engine,
                url,
                receiver_url2,
                secret,
                args.concurrency,
                http_client=clients[0],
                name="poller-paced",
            )
            procs.append(poller)
            committed = paced(engine, half, args.seconds, args.timeout)
            receipts = httpx.get(f"{receiver_url2}/receipts", timeout=30).json()
            p50, p99 = percentiles(committed, receipts)
            poller.stop()
            counts = [int(c) for c in args.processes.split(",")]
            scaled = spread(tmp, engine, url, receiver_url2, secret, args, counts, procs)
        finally:
            engine.dispose()
            for proc in procs:
                proc.stop()
    print(
        f"{args.messages:,} messages, {args.concurrency} in flight, the signature-checking "
        f"receiver; raw clients on uvloop POST the same signed payloads"
    )
    medians = {c: _median(runs) for c, runs in raw.items()}
    print(
        report(
            medians, {c: _median(runs) for c, runs in drains.items()}, clients[0], half, p50, p99
        )
    )
    print(database)
    for line in scaled:
        print(line)


def _median(runs: list[tuple[float, float]]) -> tuple[float, float]:
    """The median of each figure of the rounds (rate, per CPU second) on its own."""
    return statistics.median(r for r, _ in runs), statistics.median(c for _, c in runs)


def _round_line(
    round_: int,
    raw: dict[str, list[tuple[float, float]]],
    drains: dict[str, list[tuple[float, float]]],
) -> str:
    """One round's figures, per CPU second, and the poller's ratios to the raw clients."""
    figures = [(f"raw {c}", runs[-1][1]) for c, runs in raw.items()]
    figures += [(f"poller {c}", runs[-1][1]) for c, runs in drains.items()]
    default = next(iter(drains))
    poller = drains[default][-1][1]
    ratios = ", ".join(f"{poller / runs[-1][1]:.2f} of raw {c}" for c, runs in raw.items())
    shown = ", ".join(f"{name} {cpu:,.0f}" for name, cpu in figures)
    return f"round {round_ + 1}, per CPU second: {shown}; the poller ({default}) {ratios}"


def measured_drain(
    engine: Any, pid: int, messages: int, timeout: float, prefix: str
) -> tuple[float, float, str]:
    """A drain's deliveries/s and per CPU second of process ``pid``, and PostgreSQL's share."""
    cpu = cpu_seconds(pid)
    pg = postgres_pid(engine)
    marks: dict[str, float] = {"wal": wal_bytes(engine)}

    def committed_mark() -> None:
        marks["committed_wal"] = wal_bytes(engine)
        marks["pg_cpu"] = tree_cpu_seconds(pg) if pg else 0.0

    rate = drain(engine, messages, timeout, prefix, committed_mark)
    per_cpu = messages / (cpu_seconds(pid) - cpu)
    pg_cpu = (tree_cpu_seconds(pg) - marks["pg_cpu"]) if pg else 0.0
    per_delivery = (wal_bytes(engine) - marks["committed_wal"]) / messages
    per_enqueue = (marks["committed_wal"] - marks["wal"]) / messages
    database = (
        "PostgreSQL during the drain: "
        + (f"{messages / pg_cpu:,.0f} deliveries per CPU second (claim, complete, attempt "
           "row; all backends); " if pg_cpu else "")
        + f"WAL {per_delivery:,.0f} B per delivery, {per_enqueue:,.0f} B per message "
        f"enqueued (one transaction of {messages:,})"
    )  # fmt: skip
    return rate, per_cpu, database


def report(
    raw: dict[str, tuple[float, float]],
    drains: dict[str, tuple[float, float]],
    default: str,
    half: float,
    p50: float,
    p99: float,
) -> str:
    """The figures, and each target against its baseline of the same run."""
    rows = [
        "| run | per second | per CPU second |",
        "| --- | ---: | ---: |",
        *(f"| raw {c} | {r:,.0f} | {cpu:,.0f} |" for c, (r, cpu) in raw.items()),
        *(f"| `poller run`, {c} | {r:,.0f} | {cpu:,.0f} |" for c, (r, cpu) in drains.items()),
        "",
        "| target | measured | ratio | goal | met |",
        "| --- | ---: | ---: | ---: | --- |",
    ]
    rate, per_cpu = drains[default]
    checks = [
        ("per CPU s vs raw aiohttp", f"{per_cpu:,.0f}", per_cpu / raw["aiohttp"][1], 0.8),
        ("per CPU s vs raw pyreqwest", f"{per_cpu:,.0f}", per_cpu / raw["pyreqwest"][1], 0.5),
        ("drain rate vs raw aiohttp", f"{rate:,.0f}/s", rate / raw["aiohttp"][0], 0.5),
    ]
    for name, measured, ratio, goal in checks:
        rows.append(
            f"| {name} | {measured} | {ratio:.2f} | ≥ {goal} | {'yes' if ratio >= goal else 'no'} |"
        )
    rows.append(f"| commit→receipt p50 at {half:,.0f}/s | {p50:.1f} ms | | ≤ 5 ms | "
                f"{'yes' if p50 <= 5 else 'no'} |")  # fmt: skip
    rows.append(f"| commit→receipt p99 at {half:,.0f}/s | {p99:.1f} ms | | ≤ 50 ms | "
                f"{'yes' if p99 <= 50 else 'no'} |")  # fmt: skip
    return "\n".join(rows)


if __name__ == "__main__":
    main()
