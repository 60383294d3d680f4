"""Deliveries to each broker by one `poller run` process, beside the raw client publishing the
same messages with the same confirm mode, same run.

    python -m loadtest.brokers_bench [--messages 20000] [--concurrency 64] [--rounds 5]
                                     [--brokers nats,amqp,redis]

For each broker (a real server of this run's own, poller/local/brokers.py):

1. raw: the broker's client — nats-py's ``js.publish`` awaiting each PubAck with
   ``Nats-Msg-Id``, aio-pika publishing persistent mandatory messages on a confirm-mode
   channel, redis-py's ``XADD`` — publishes --messages signed payloads with
   --concurrency in flight; its rate, and the CPU seconds this process spent;
2. drain: --messages are committed at once to an endpoint on the broker while one
   `poller run` process idles; deliveries/s until all are delivered, and the CPU
   seconds the poller spent.

1 and 2 run --rounds times, interleaved; the table takes the medians. A raw round of
5,000 messages took half a second, and its CPU per message swung by half from round to
round: 20,000 a round by default. The figure the issue asks for is the ratio:
deliveries per poller CPU second over publishes per raw-client CPU second (≥ 0.6),
of the medians and paired — the median of each round's own ratio, its raw run and
its drain seconds apart, so a machine that slows for a while slows both sides of a
pair (one side's CPU per message swung by a fifth between rounds a minute apart).
The poller's side also claims, signs, records every attempt and completes in
PostgreSQL; on Redis it publishes through the dedupe script
(poller/deliver/redis_sender.py), the raw client a bare XADD.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import aio_pika
import nats
import redis.asyncio
import uvloop
from nats.js.api import StreamConfig

from loadtest.bench_db import fresh_database, server_url
from loadtest.deliveries import _cpu, _payload, drain, start_poller
from loadtest.procs import Proc, tree_cpu_seconds
from poller.endpoints.registry import create_endpoint, new_secret
from poller.local.brokers import EmbeddedNats, EmbeddedRabbitMQ
from poller.local.embedded import EmbeddedRedis
from poller.rules.signing import sign
from poller.service.server_watch import stop_at_exit
from poller.store.db import sync_engine

NAME = "bench"


def _signed(secret: str, n: int, body: bytes) -> dict[str, str]:
    stamp = int(time.time())
    return {
        "webhook-id": f"raw:{n}",
        "webhook-timestamp": str(stamp),
        "webhook-signature": sign([secret], f"raw:{n}", stamp, body),
        "Content-Type": "application/json",
    }


async def _prepare(kind: str, server: str) -> None:
    """The stream or queue both sides publish to (emptied between runs)."""
    if kind == "nats":
        nc = await nats.connect(server)
        js = nc.jetstream()
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await js.delete_stream(NAME.upper())
        await js.add_stream(StreamConfig(name=NAME.upper(), subjects=[f"{NAME}.>"]))
        await nc.close()
    elif kind == "amqp":
        connection = await aio_pika.connect(server)
        channel = await connection.channel()
        queue = await channel.declare_queue(NAME, durable=True)
        await queue.purge()
        await connection.close()
    else:
        async with redis.asyncio.Redis.from_url(server) as client:
            await client.flushdb()


def _url(kind: str, server: str) -> str:
    return {
        "nats": f"{server}/{NAME}.events",
        "amqp": f"{server}?routing_key={NAME}",
        "redis": f"{server}?stream={NAME}",
    }[kind]


async def raw(
    kind: str, server: str, messages: int, concurrency: int, secret: str
) -> tuple[float, float]:
    """Publishes/s of the broker's own client and the CPU seconds this process spent."""
    await _prepare(kind, server)
    bodies = [json.dumps(_payload(n)).encode() for n in range(messages)]
    todo = iter(range(messages))
    if kind == "nats":
        nc = await nats.connect(server)
        js = nc.jetstream()

        async def publish(n: int) -> None:
            headers = {**_signed(secret, n, bodies[n]), "Nats-Msg-Id": f"raw:{n}"}
            await js.publish(f"{NAME}.events", bodies[n], headers=headers, timeout=10)

        close: Any = nc.close
    elif kind == "amqp":
        connection = await aio_pika.connect(server)
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)

        async def publish(n: int) -> None:
            message = aio_pika.Message(
                bodies[n], headers=_signed(secret, n, bodies[n]), message_id=f"raw:{n}",
                content_type="application/json", delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            )  # fmt: skip
            await channel.default_exchange.publish(message, NAME, mandatory=True, timeout=10)

        close = connection.close
    else:
        client = redis.asyncio.Redis.from_url(server, max_connections=concurrency)

        async def publish(n: int) -> None:
            fields: dict[Any, Any] = {**_signed(secret, n, bodies[n]), "body": bodies[n]}
            await client.xadd(NAME, fields)

        close = client.aclose

    async def worker() -> None:
        for n in todo:
            await publish(n)

    began, cpu = time.perf_counter(), _cpu()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    rate, used = messages / (time.perf_counter() - began), _cpu() - cpu
    await close()
    return rate, used


def poller_drain(
    engine: Any, poller: Proc, kind: str, server: str, messages: int, round_: int
) -> tuple[float, float]:
    """Deliveries/s of the idle poller draining ``messages`` committed at once, and the
    CPU seconds it spent."""
    uvloop.run(_prepare(kind, server))
    cpu = tree_cpu_seconds(poller.popen.pid)
    rate = drain(engine, messages, timeout=300, prefix=f"{kind}{round_}")
    return rate, tree_cpu_seconds(poller.popen.pid) - cpu


def bench(
    kind: str, server: str, args: argparse.Namespace, tmp: Path, admin: str
) -> dict[str, Any]:
    url = fresh_database(admin, f"brokers_{kind}")
    engine = sync_engine(url)
    secret = new_secret()
    with engine.begin() as conn:
        create_endpoint(conn, "bench", _url(kind, server), secret=secret, allow_private=True,
                        max_in_flight=args.concurrency)  # fmt: skip
    poller = start_poller(tmp, engine, url, "", secret, args.concurrency, name=f"poller-{kind}")
    raws, drains = [], []
    try:
        for round_ in range(args.rounds):
            raws.append(uvloop.run(raw(kind, server, args.messages, args.concurrency, secret)))
            drains.append(poller_drain(engine, poller, kind, server, args.messages, round_))
            print(f"  {kind} round {round_ + 1}: raw {raws[-1][0]:,.0f}/s "
                  f"({args.messages / raws[-1][1]:,.0f} per CPU s), poller {drains[-1][0]:,.0f}/s "
                  f"({args.messages / drains[-1][1]:,.0f} per CPU s), "
                  f"ratio {raws[-1][1] / drains[-1][1]:.2f}", flush=True)  # fmt: skip
    finally:
        poller.stop()
        engine.dispose()
    raw_rate = statistics.median(r for r, _ in raws)
    raw_per_cpu = statistics.median(args.messages / c for _, c in raws)
    rate = statistics.median(r for r, _ in drains)
    per_cpu = statistics.median(args.messages / c for _, c in drains)
    paired = statistics.median(r[1] / d[1] for r, d in zip(raws, drains, strict=True))
    return {"kind": kind, "raw": raw_rate, "raw_cpu": raw_per_cpu, "poller": rate,
            "poller_cpu": per_cpu, "ratio": per_cpu / raw_per_cpu, "paired": paired}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--brokers", default="nats,amqp,redis")
    args = parser.parse_args()
    kinds = [k for k in args.brokers.split(",") if k]
    results = []
    with (
        tempfile.TemporaryDirectory(prefix="poller-brokers-bench-") as folder,
        server_url() as admin,
    ):
        tmp = Path(folder)
        made = {"nats": EmbeddedNats, "amqp": EmbeddedRabbitMQ, "redis": EmbeddedRedis}
        for kind in kinds:
            (tmp / kind).mkdir()
            server = made[kind](tmp / kind)
            stop_at_exit(server)
            try:
                results.append(bench(kind, server.start(), args, tmp, admin))
            finally:
                server.stop()
    print(f"\n{args.messages:,} messages, {args.concurrency} in flight, medians of {args.rounds}")
    print("| broker | raw client /s | raw per CPU s | poller /s | poller per CPU s | ratio | "
          "ratio, paired |")  # fmt: skip
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        print(f"| {r['kind']} | {r['raw']:,.0f} | {r['raw_cpu']:,.0f} | {r['poller']:,.0f} | "
              f"{r['poller_cpu']:,.0f} | {r['ratio']:.2f} | {r['paired']:.2f} |")  # fmt: skip


if __name__ == "__main__":
    main()
