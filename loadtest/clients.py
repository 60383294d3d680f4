"""What each HTTP client costs per request on this machine, same run: the floor of what
a delivery can cost, and the figures the choice of the wire rests on.

    python -m loadtest.clients [--requests 20000] [--concurrency 64] [--rounds 3]

One receiver, a raw ASGI app under granian in its own process (it reads the body
and answers 200 with ``ok``: as cheap as a receiver gets, so the client is what is
measured, and a body to read, as most receivers send).
Each client POSTs ``--requests`` signed-webhook-sized bodies (~300 B, the headers a
delivery carries) with ``--concurrency`` in flight, from a process of its own (no
client's threads or pools linger into another's figures). Rounds interleave the
clients, each round in another order; the table gives medians: requests a second,
requests per CPU second of the client's process (user + system, every thread: the
Rust clients' runtimes included), that against aiohttp's, and each request's CPU
on the event loop's thread and in the others (a Rust client's runtime). Two more rows show the
wire as the poller uses it: ``pyreqwest-streamed`` (status first, then the body: the
exchange the sender's contract needs) and ``poller-reqwest`` (the poller's own
ReqwestSender around it), so what each adds over plain pyreqwest is measured too;
``pyreqwest-readahead`` is the streamed exchange reading up to 64 KiB of body before
the status is seen: what the contract costs (docs/explanation/performance.md).

Every client runs on uvloop, the poller's loop: pyreqwest completes its futures from
its own runtime thread through the loop, which uvloop does far more cheaply than
asyncio's default loop (there pyreqwest measured no better than aiohttp). pyreqwest
runs on its default runtime, as the poller's sender does.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

CLIENTS = (
    "aiohttp",
    "httpx",
    "pyreqwest",
    "rnet",
    "curl_cffi",
    "pyreqwest-streamed",
    "poller-reqwest",
    "pyreqwest-readahead",
)
"""The first five are the candidates for the wire, as their users call them (curl_cffi
is libcurl). The next two are the wire as the poller uses it: pyreqwest's streamed
exchange (the status as soon as it arrives, then the body: what the sender's contract
needs), and the poller's own ReqwestSender around it (guard, pinned client,
classification). The last reads ahead: cheaper, but a body that stalls after the status
costs the status."""
BODY = json.dumps({"type": "order.paid", "data": {"order": 7, "pad": "x" * 220}}).encode()
HEADERS = {
    "content-type": "application/json",
    "webhook-id": "msg_2b5f0c3e9d1a4f6b8c7e",
    "webhook-timestamp": "1796170000",
    "webhook-signature": "v1,K5oZfzN95Z9UVu1EsfQmfVNQhnkZ2pj9o9NDN/H/pI4=",
}


_OK_HEADERS = [(b"content-type", b"text/plain"), (b"content-length", b"2")]


async def receiver(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The raw ASGI receiver: read the body, answer 200 ``ok``."""
    if scope["type"] != "http":
        return
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": _OK_HEADERS})
    await send({"type": "http.response.body", "body": b"ok"})


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _fire(post: Callable[[], Awaitable[int]], requests: int, concurrency: int) -> None:
    left = iter(range(requests))

    async def worker() -> None:
        for _ in left:
            status = await post()
            if status != 200:
                raise RuntimeError(f"the receiver answered {status}")

    await asyncio.gather(*(worker() for _ in range(concurrency)))


Post = Callable[[], Awaitable[int]]
Close = Callable[[], Awaitable[Any]]


def _aiohttp(url: str, concurrency: int) -> tuple[Post, Close]:
    import aiohttp

    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency))

    async def post() -> int:
        async with session.post(url, data=BODY, headers=HEADERS) as answer:
            await answer.read()
            return answer.status

    return post, session.close


def _httpx(url: str, concurrency: int) -> tuple[Post, Close]:
    import httpx

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    hx = httpx.AsyncClient(limits=limits)

    async def post() -> int:
        answer = await hx.post(url, content=BODY, headers=HEADERS)
        return answer.status_code

    return post, hx.aclose


def _pyreqwest(url: str, concurrency: int) -> tuple[Post, Close]:
    from pyreqwest.client import ClientBuilder

    rq = ClientBuilder().max_connections(concurrency).build()

    async def post() -> int:
        answer = await rq.post(url).headers(HEADERS).body_bytes(BODY).build().send()
        await answer.bytes()
        return answer.status

    return post, rq.close


def _rnet(url: str, concurrency: int) -> tuple[Post, Close]:
    import rnet

    rn = rnet.Client(pool_max_size=concurrency)

    async def post() -> int:
        answer = await rn.post(url, body=BODY, headers=HEADERS)
        await answer.bytes()
        return int(answer.status)

    async def close() -> None:
        return None

    return post, close


def _curl_cffi(url: str, concurrency: int) -> tuple[Post, Close]:
    from curl_cffi.requests import AsyncSession

    session: Any = AsyncSession(max_clients=concurrency)

    async def post() -> int:
        answer = await session.post(url, data=BODY, headers=HEADERS)
        return int(answer.status_code)

    return post, session.close


def _pyreqwest_streamed(url: str, concurrency: int) -> tuple[Post, Close]:
    from datetime import timedelta

    from pyreqwest.client import ClientBuilder

    rs = ClientBuilder().max_connections(concurrency).timeout(timedelta(seconds=30)).build()

    async def post() -> int:
        builder = rs.post(url).headers(HEADERS).body_bytes(BODY)
        async with builder.streamed_read_buffer_limit(0).build_streamed() as answer:
            await answer.body_reader.read(64 * 1024)
            return answer.status

    return post, rs.close


def _pyreqwest_readahead(url: str, concurrency: int) -> tuple[Post, Close]:
    from datetime import timedelta

    from pyreqwest.client import ClientBuilder

    ra = ClientBuilder().max_connections(concurrency).timeout(timedelta(seconds=30)).build()

    async def post() -> int:
        builder = ra.post(url).headers(HEADERS).body_bytes(BODY)
        async with builder.streamed_read_buffer_limit(64 * 1024).build_streamed() as answer:
            await answer.body_reader.read(64 * 1024)
            return answer.status

    return post, ra.close


def _poller_reqwest(url: str, concurrency: int) -> tuple[Post, Close]:
    from poller.deliver.reqwest_sender import ReqwestSender

    sender = ReqwestSender(limit=concurrency, allow_private=True)

    async def post() -> int:
        return (await sender.request("POST", url, HEADERS, BODY, 30.0)).status

    return post, sender.aclose


POSTERS = {
    "aiohttp": _aiohttp,
    "httpx": _httpx,
    "pyreqwest": _pyreqwest,
    "rnet": _rnet,
    "curl_cffi": _curl_cffi,
    "pyreqwest-streamed": _pyreqwest_streamed,
    "poller-reqwest": _poller_reqwest,
    "pyreqwest-readahead": _pyreqwest_readahead,
}


async def one(client: str, url: str, requests: int, concurrency: int) -> dict[str, float]:
    """``requests`` POSTs with ``client``; its wall and CPU seconds (a warm-up aside)."""
    if client not in POSTERS:
        raise SystemExit(f"unknown client {client!r}: one of {', '.join(CLIENTS)}")
    post, close = POSTERS[client](url, concurrency)
    await _fire(post, min(requests, 1000), concurrency)  # warm: connections, caches
    began, cpu, loop = time.perf_counter(), _cpu(), time.thread_time()
    await _fire(post, requests, concurrency)
    wall, used = time.perf_counter() - began, _cpu() - cpu
    on_loop = time.thread_time() - loop  # this coroutine runs on the event loop's thread
    await close()
    return {"wall": wall, "cpu": used, "loop": on_loop}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _serve() -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "granian", "--interface", "asgi", "--host", "127.0.0.1",
         "--port", str(port), "--workers", "1", "--no-ws", "--log-level", "warning",
         "loadtest.clients:receiver"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, f"http://127.0.0.1:{port}/hook"
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("granian did not start within 30 s")


def measure(requests: int, concurrency: int, rounds: int) -> dict[str, dict[str, float]]:
    """Medians per client over ``rounds`` interleaved rounds."""
    proc, url = _serve()
    runs: dict[str, list[dict[str, float]]] = {c: [] for c in CLIENTS}
    exits: dict[str, set[int]] = {}
    try:
        for n in range(rounds):
            order = CLIENTS[n % len(CLIENTS) :] + CLIENTS[: n % len(CLIENTS)]
            for client in order:
                out = subprocess.run(
                    [sys.executable, "-m", "loadtest.clients", "--one", client, "--url", url,
                     "--requests", str(requests), "--concurrency", str(concurrency)],
                    capture_output=True, text=True, timeout=600,
                )  # fmt: skip
                lines = out.stdout.strip().splitlines()
                if not lines or not lines[-1].startswith("{"):
                    raise SystemExit(f"{client} failed ({out.returncode}): {out.stderr[-500:]}")
                runs[client].append(json.loads(lines[-1]))
                if out.returncode != 0:  # a Rust client's runtime at interpreter exit: noted
                    exits.setdefault(client, set()).add(out.returncode)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    for client, codes in exits.items():
        print(f"note: {client}'s process exited {sorted(codes)} after it measured")
    return {
        client: {
            "per_s": statistics.median(requests / r["wall"] for r in found),
            "per_cpu_s": statistics.median(requests / r["cpu"] for r in found),
            "loop_us": statistics.median(r["loop"] * 1e6 / requests for r in found),
            "other_us": statistics.median(
                max(0.0, r["cpu"] - r["loop"]) * 1e6 / requests for r in found
            ),
        }
        for client, found in runs.items()
    }


def table(found: dict[str, dict[str, float]]) -> str:
    base = found["aiohttp"]["per_cpu_s"]
    rows = ["| client | requests/s | requests per CPU second | × aiohttp per CPU s "
            "| µs on the event loop / other threads |",
            "| --- | ---: | ---: | ---: | ---: |"]  # fmt: skip
    for client, f in found.items():
        split = f"{f['loop_us']:.0f} / {f['other_us']:.0f}"
        rows.append(f"| {client} | {f['per_s']:,.0f} | {f['per_cpu_s']:,.0f} | "
                    f"{f['per_cpu_s'] / base:.2f} | {split} |")  # fmt: skip
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--one", choices=CLIENTS, help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        import uvloop

        print(json.dumps(uvloop.run(one(args.one, args.url, args.requests, args.concurrency))))
        return
    print(f"{args.requests:,} POSTs of {len(BODY)} B, {args.concurrency} in flight, medians "
          f"of {args.rounds} interleaved rounds, receiver: raw ASGI under granian")  # fmt: skip
    print(table(measure(args.requests, args.concurrency, args.rounds)))


if __name__ == "__main__":
    main()
