"""``poller demo``: the whole flow on throwaway embedded servers, then clean up.

Starts PostgreSQL and Redis in a temporary folder, migrates, starts two
reference receivers (one healthy but flaky: some 5xx, some answers dropped
after processing; one that answers 500 until the other's messages are delivered),
creates an endpoint on each
(the healthy one with a lookup URL), runs two pollers elected through Redis
(shards split between them), enqueues messages from inside SQLAlchemy
transactions (plus one rolled back, which never appears), shows live progress
and ends with a summary. One message in five is ordered per customer (an
ordering key); the summary counts order violations at the receiver. The
broken endpoint's circuit opens after a few failed sends: its messages wait,
spending no attempts, while probes test it; once the healthy endpoint's
messages are delivered the broken receiver comes back, a probe closes the
circuit and its backlog drains. Operational events are printed as they
happen. Then it publishes events to subscribed endpoints (fan-out): each
invoice event goes to every endpoint subscribed to ``invoice.*`` — half of
them for tenant ``acme``, which only acme's endpoint receives. Everything it
started is stopped before it exits.
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
import time
from pathlib import Path
from typing import Any

import click
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from poller import Event, Message, enqueue_async, enqueue_many_async, publish_many_async
from poller.cli.run import event_loop_run
from poller.deliver.sending import make_sender
from poller.endpoints.registry import create_endpoint, new_secret
from poller.local.embedded import EmbeddedPostgres, EmbeddedRedis
from poller.local.receiver import Faults, Receiver
from poller.observe import metrics
from poller.rows.events import OperationalEvent
from poller.rules.signing import public_key
from poller.service.runner import Poller, serve
from poller.settings import load_settings
from poller.store import migrate, queries
from poller.store.db import poller_engine, sync_engine

# The default schedule waits 5 s, 5 min, 30 min… between attempts: right for a real
# receiver, far too slow to watch. The demo retries after 0.2, 0.5 and 1 s instead.
ORDERED_KEYS = 20

DEMO_SETTINGS: dict[str, Any] = {
    "lease_ttl": 3.0,
    "retry_schedule": [0.2, 0.5, 1.0],
    "request_timeout": 2.0,
    "claim_lease": 6.0,
    "sweep_interval": 0.5,
    "allow_private_targets": True,
    "shutdown_grace": 2.0,
    # The circuit breaker: open after 5 failed sends in a row, probe after 1 s, then 2 s.
    "circuit_failures": 5,
    "circuit_cooldown": 1.0,
    "circuit_cooldown_max": 2.0,
}


@click.command()
@click.option("--messages", default=3000, show_default=True, help="How many messages to enqueue.")
@click.option("--timeout", default=50.0, show_default=True, help="Give up after this many seconds.")
@click.option(
    "--dashboard",
    "with_dashboard",
    is_flag=True,
    help="Then serve the dashboard on the demo's database (POLLER_DASHBOARD_ADDR) until Ctrl-C.",
)
def demo(messages: int, timeout: float, with_dashboard: bool) -> None:
    """Deliver messages end to end on embedded PostgreSQL + Redis in a temporary folder."""
    console = Console()
    # One line per failed message would drown the progress table: the summary says it.
    # Errors (a crashed loop) still show.
    logging.getLogger("poller").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="poller-demo-") as tmp:
        pg, redis = EmbeddedPostgres(Path(tmp), durable=False), EmbeddedRedis(Path(tmp))
        try:
            url = pg.start()
            console.print(f"[bold]PostgreSQL[/] {url}   [bold]Redis[/] {redis.start()}")
            migrate.upgrade(url)
            console.print(f"schema at revision {migrate.current_revision(url)}")
            ok = event_loop_run(_demo(console, url, redis.url(), messages, timeout))
            if with_dashboard:
                _dashboard(console, Path(tmp), url, redis.url())
            else:
                console.print(
                    "to look at a run like this one in a browser: "
                    f"[bold]{_this_command()} demo --dashboard[/] (it keeps the servers "
                    "and serves the dashboard on them until Ctrl-C)"
                )
        finally:
            redis.stop()
            pg.stop()
    if not ok:
        raise SystemExit(1)


def _this_command() -> str:
    """How to run this ``poller`` again from here: its name if the shell finds this one,
    else its path (``.venv/bin/poller`` after ``make demo``, which puts nothing on PATH)."""
    import os
    import shutil
    import sys

    program = Path(sys.argv[0]).resolve()
    if program.name != "poller":  # python -m poller
        return f"{Path(sys.executable).name} -m poller"
    found = shutil.which("poller")
    if found and Path(found).resolve() == program:
        return "poller"
    try:
        return os.path.relpath(program)
    except ValueError:  # another drive
        return str(program)


def _dashboard(console: Console, folder: Path, url: str, redis_url: str) -> None:
    """Serve the dashboard on the demo's database until SIGINT/SIGTERM (poller/web)."""
    import secrets
    from datetime import timedelta

    from poller.access.portal import portal_link
    from poller.settings import load_settings
    from poller.web import serve as board

    first = load_settings()
    addr = first.dashboard_addr or board.DEFAULT_ADDR
    key = first.portal_key.get_secret_value() if first.portal_key else secrets.token_urlsafe(32)
    settings = load_settings(database_url=url, redis_url=redis_url, election="redis",
                             portal_key=key)  # fmt: skip
    from poller.local.embedded import DASHBOARD_TOKEN_FILE, dashboard_token

    path = folder / DASHBOARD_TOKEN_FILE
    creds = board.Credentials(dashboard_token(path), token_file=path)
    sock = board.bind(addr)
    host, port = sock.getsockname()[:2]
    base = f"http://{host}:{port}"
    link = portal_link("acme", timedelta(hours=1), settings=settings, base_url=base)
    console.print(
        f"dashboard on {base}/ — open {base}/login?token={creds.token}\n"
        f"acme's webhook portal (what acme's people see; opens once, within the hour) — "
        f"open {link}\n"
        "(Ctrl-C ends the demo)",
        soft_wrap=True,
    )
    engine = sync_engine(url)
    try:
        board.serve(board.build(settings, url, engine, creds), sock)
    finally:
        engine.dispose()


# Fan-out: endpoints subscribed to published events, each with its own receiver.
# (name, event types, tenant): acme's events reach only acme's endpoint.
SUBSCRIBERS = (
    ("ledger", ["invoice.*"], None),
    ("analytics", ["*"], None),
    ("acme-hooks", ["invoice.*"], "acme"),
)


async def _demo(console: Console, url: str, redis_url: str, count: int, timeout: float) -> bool:
    secret = new_secret()
    healthy = Receiver([secret], Faults(fail_rate=0.05, drop_after_process_rate=0.02))
    broken = Receiver([secret], Faults(fail_rate=1.0, status=500))
    healthy_url = f"http://127.0.0.1:{await healthy.start()}"
    broken_url = f"http://127.0.0.1:{await broken.start()}"
    # ledger signs with ed25519: its receiver holds the public key alone. analytics sits
    # behind a gateway that wants a bearer token: the endpoint sends it as a header.
    ledger_key, token = new_secret("ed25519"), f"Bearer demo-{new_secret()[6:18]}"
    keys = {"ledger": ledger_key, "analytics": secret, "acme-hooks": secret}
    subscribers = {
        "ledger": Receiver([public_key(ledger_key) or ""]),
        "analytics": Receiver([secret], required={"Authorization": token}),
        "acme-hooks": Receiver([secret]),
    }
    engine = sync_engine(url)
    with engine.begin() as conn:
        for name, event_types, tenant in SUBSCRIBERS:
            port = await subscribers[name].start()
            create_endpoint(
                conn,
                name,
                f"http://127.0.0.1:{port}/{name}",
                secret=keys[name],
                allow_private=True,
                event_types=event_types,
                tenant=tenant,
                headers={"Authorization": token} if name == "analytics" else None,
            )
    with engine.begin() as conn:
        create_endpoint(
            conn,
            "orders",
            f"{healthy_url}/orders",
            secret=secret,
            allow_private=True,
            lookup_url=f"{healthy_url}/webhooks/{{idempotency_key}}",
        )
        create_endpoint(
            conn,
            "legacy",
            f"{broken_url}/legacy",
            secret=secret,
            allow_private=True,
            max_attempts=3,
        )
    engine.dispose()
    console.print(
        f"receivers: orders → {healthy_url} (5 % 5xx, 2 % dropped after processing), "
        f"legacy → {broken_url} (answers 500 until the orders are delivered, 3 attempts)"
    )
    console.print(
        f"ledger signs with ed25519 (v1a): its receiver verifies with the public key "
        f"{public_key(ledger_key)} alone; analytics sends an Authorization header its "
        "receiver requires (sealed at rest, shown by name only)"
    )
    schedule = ", ".join(f"{s:g}" for s in DEMO_SETTINGS["retry_schedule"])
    console.print(
        f"retries after {schedule} s (the default waits 5 s, 5 min, 30 min…: "
        "shortened so the demo settles in seconds)"
    )

    settings = load_settings(**DEMO_SETTINGS, redis_url=redis_url)
    aengine = poller_engine(url, settings, pool_size=8)
    stop = asyncio.Event()
    senders = [make_sender(settings) for _ in range(2)]
    ready: list[asyncio.Future[Poller]] = [
        asyncio.get_running_loop().create_future() for _ in senders
    ]
    runs = [
        asyncio.create_task(
            serve(
                settings,
                engine=aengine,
                sender=sender,
                database_url=url,
                poller_id=f"poller-{n}",
                stop=stop,
                ready=ready[n - 1],
            )
        )
        for n, sender in enumerate(senders, 1)
    ]
    try:
        await _started(ready, runs)
        pollers = [future.result() for future in ready]
        for poller in pollers:
            poller.on_event.append(lambda event: console.print(_event_line(event)))
        console.print(
            f"two pollers elected through Redis, {settings.shards} shards: "
            + ", ".join(
                f"{p.poller_id} leads {len(p.shards.held) if p.shards else 0}" for p in pollers
            )
        )
        began = time.monotonic()
        await _enqueue(aengine, count)
        console.print(
            f"enqueued {count} messages in {time.monotonic() - began:.2f}s "
            "(+1 in a transaction that rolled back); one in five is ordered, "
            f"per customer ({ORDERED_KEYS} ordering keys)"
        )
        events = max(count // 10, 2)
        fanned = await _publish(aengine, events)
        console.print(
            f"published {events} invoice events ({events // 2} for tenant acme): "
            f"{fanned} deliveries to {len(SUBSCRIBERS)} subscribed endpoints"
        )
        total = count + fanned
        legacy = sum(1 for n in range(count) if n % 50 == 0)
        finished = await _watch(console, aengine, pollers, total, legacy, began, timeout, broken)
        console.print()
    finally:
        stop.set()
        await asyncio.gather(*runs, return_exceptions=True)
        for sender in senders:
            await sender.aclose()
        await healthy.stop()
        await broken.stop()
        for receiver in subscribers.values():
            await receiver.stop()
    summary = await _summary(
        aengine, pollers, healthy, time.monotonic() - began, subscribers, broken
    )
    await aengine.dispose()
    console.print(summary)
    return finished


async def _started(ready: list[asyncio.Future[Poller]], runs: list[asyncio.Task[Poller]]) -> None:
    """Until every poller runs; a poller that failed to start raises its error here."""
    waiting: set[asyncio.Future[Poller]] = set(ready)
    while waiting:
        done, _ = await asyncio.wait(
            [*waiting, *runs], timeout=30, return_when=asyncio.FIRST_COMPLETED
        )
        if not done:
            raise TimeoutError("the pollers did not start within 30s")
        for run in runs:
            if run.done():
                run.result()
                raise RuntimeError("a poller stopped while starting")
        waiting -= done


async def _enqueue(engine: AsyncEngine, count: int) -> None:
    async with AsyncSession(engine) as session:  # rolled back: never delivered
        await enqueue_async(
            session,
            endpoint="orders",
            event_type="order.created",
            payload={"order": -1},
            idempotency_key="order:rolled-back",
        )
        await session.rollback()
    for start in range(0, count, 250):
        batch = [
            Message(
                "legacy" if n % 50 == 0 else "orders",
                "order.created" if n % 5 else "customer.changed",
                {"order": n, "enqueued_at": time.time()},
                f"order:{n}",
                # One in five is a customer's change: one customer's go out in order.
                ordering_key=None if n % 5 or n % 50 == 0 else f"customer:{n // 5 % ORDERED_KEYS}",
            )
            for n in range(start, min(count, start + 250))
        ]
        async with AsyncSession(engine) as session, session.begin():
            await enqueue_many_async(session, batch)


async def _publish(engine: AsyncEngine, events: int) -> int:
    """Invoice events, every other one for tenant acme; returns the deliveries made."""
    batch = [
        Event(
            "invoice.paid",
            {"invoice": n, "enqueued_at": time.time()},
            f"invoice:{n}",
            tenant="acme" if n % 2 else None,
        )
        for n in range(events)
    ]
    async with AsyncSession(engine) as session, session.begin():
        published = await publish_many_async(session, batch)
    return sum(len(p.deliveries) for p in published)


async def _counts(engine: AsyncEngine) -> dict[str, int]:
    async with engine.connect() as conn:
        rows = await conn.execute(queries.COUNT_BY_STATUS)
        return {status: n for status, n in rows}


async def _watch(
    console: Console,
    engine: AsyncEngine,
    pollers: list[Poller],
    count: int,
    legacy: int,
    began: float,
    timeout: float,
    broken: Receiver,
) -> bool:
    """Until ``count`` rows ended; ``legacy``'s receiver comes back once the others are done."""
    with Live(console=console, refresh_per_second=8, transient=False) as live:
        while True:
            counts = await _counts(engine)
            done = counts.get("delivered", 0) + counts.get("failed", 0)
            live.update(_progress(counts, pollers, time.monotonic() - began))
            if done >= count:
                return True
            if broken.faults.fail_rate and counts.get("delivered", 0) >= count - legacy:
                broken.faults.fail_rate = 0.0
                console.print("legacy's receiver is back: the next probe will close its circuit")
            if time.monotonic() - began > timeout:
                console.print(f"[red]gave up after {timeout:g}s with {count - done} open[/]")
                return False
            await asyncio.sleep(0.125)


def _progress(counts: dict[str, int], pollers: list[Poller], elapsed: float) -> Table:
    table = Table(title=f"outbox after {elapsed:.1f}s")
    for status in ("waiting", "pending", "in_flight", "delivered", "failed"):
        table.add_column(status, justify="right")
    table.add_column("deliveries/s", justify="right")
    table.add_column("retries", justify="right")
    delivered = counts.get("delivered", 0)
    retries = int(sum(metrics.DELIVERIES.outcome_total(o) for o in ("retry", "unknown")))
    table.add_row(
        *(
            str(counts.get(s, 0))
            for s in ("waiting", "pending", "in_flight", "delivered", "failed")
        ),
        f"{delivered / max(elapsed, 1e-9):,.0f}",
        str(retries),
    )
    return table


def _event_line(event: OperationalEvent) -> str:
    from rich.markup import escape

    from poller.cli.output import safe_text

    said = escape(safe_text(f"{event.type} {event.endpoint}: {event.reason}"))
    return f"[yellow]event[/] {said}"  # a reason may quote a receiver: never markup


async def _summary(
    engine: AsyncEngine,
    pollers: list[Poller],
    receiver: Receiver,
    elapsed: float,
    subscribers: dict[str, Receiver],
    broken: Receiver,
) -> Group:
    counts = await _counts(engine)
    async with engine.connect() as conn:
        reasons = (await conn.execute(queries.FAILED_BY_REASON)).all()
        rolled_back = (
            await conn.execute(queries.COUNT_WITH_KEY, {"key": "order:rolled-back"})
        ).scalar_one()
    stats = receiver.stats.as_dict()
    lat = stats["latency_ms"]
    table = Table(title=f"summary after {elapsed:.1f}s", show_header=False)
    table.add_column(justify="left")
    table.add_column(justify="right")
    rows: list[tuple[str, Any]] = [
        ("delivered", counts.get("delivered", 0)),
        ("failed", counts.get("failed", 0)),
        (
            "still open",
            counts.get("pending", 0) + counts.get("in_flight", 0) + counts.get("waiting", 0),
        ),
        ("rolled-back message stored", rolled_back),
        ("applied by orders' receiver (unique keys)", stats["unique"]),
        ("applied by legacy's receiver, once it came back", broken.stats.applied),
        ("duplicates suppressed by the receiver", stats["duplicates"]),
        (
            "injected 5xx / dropped answers",
            f"{stats['failed_injected']} / {stats['dropped_injected']}",
        ),
        (
            "unknown outcomes resolved by lookup",
            int(metrics.sample_total(metrics.LOOKUPS, result="found")),
        ),
        (
            "lookups that found nothing (re-sent)",
            int(metrics.sample_total(metrics.LOOKUPS, result="not_found")),
        ),
        ("stale completions (fenced)", int(metrics.sample_total(metrics.STALE_COMPLETIONS))),
        (
            "circuits opened / probes sent",
            f"{int(metrics.sample_total(metrics.CIRCUIT_OPENS))}"
            f" / {int(metrics.sample_total(metrics.CIRCUIT_PROBES))}",
        ),
        (
            "ordered messages applied / order violations",
            f"{stats['ordered']} / {stats['order_violations']}",
        ),
        ("commit→receipt p50 / p99", f"{lat['p50'] or 0:.1f} ms / {lat['p99'] or 0:.1f} ms"),
        (
            "fan-out applied: " + " / ".join(subscribers),
            " / ".join(str(r.stats.applied) for r in subscribers.values()),
        ),
        (
            "ledger (ed25519, public key only): bad signatures",
            subscribers["ledger"].stats.bad_signatures,
        ),
        (
            "analytics (bearer header required): refused",
            subscribers["analytics"].stats.unauthorized,
        ),
    ]
    for label, value in rows:
        table.add_row(label, str(value))
    why = Table(title="failed, by reason")
    why.add_column("endpoint")
    why.add_column("last error")
    why.add_column("messages", justify="right")
    for name, error, n in reasons:
        why.add_row(name, error or "", str(n))
    return Group(table, why) if reasons else Group(table)
