"""The fault hunt on broker destinations: a seeded run against a real broker, then invariants.

    python -m loadtest.hunt_brokers [--seeds 30] [--seed N …] [--messages 400] [--deadline 120]

Each seed draws, reproducibly, a broker — NATS JetStream, RabbitMQ or a Redis stream,
each a real server of the seed's own (poller/local/brokers.py) — two or three ``poller
run`` processes delivering to one endpoint on it, and a schedule of faults while a
feeder commits messages (a tenth rolled back, half on eight ordering keys, a third
published as events to the endpoint's subscription):

* **broker restart**: NATS and RabbitMQ stopped and started again on their data (what
  they confirmed survives); Redis, which runs without persistence here, has every
  client connection killed instead (``CLIENT KILL``);
* **confirm withheld**: the broker frozen (SIGSTOP) past the request timeout and thawed,
  or Redis's writes paused (``CLIENT PAUSE … WRITE``) as long: the publishes in flight
  end *unknown* and are resent;
* **stream or queue deleted and recreated** (what was in it is gone: the operator's
  doing);
* **a poller killed** (SIGKILL) and restarted: its claims expire and are resent;
* **the operator** pauses the endpoint for 1.5 s and resumes it, and replays every event
  published so far, through the functions the CLI calls;
* **the extreme budget**: a third of the seeds give the endpoint ``max_attempts`` 2, so
  messages end ``failed`` under the faults.

When all is settled (loadtest/hunt_check.py's counterpart for brokers, :func:`check`):

* every committed message is ``delivered`` or ``failed`` (none pending, none in flight),
  and nothing rolled back was stored;
* on JetStream and Redis no message id appears twice in the stream; on RabbitMQ every
  id queued twice belongs to a message with an outcome that explains it (``unknown``,
  ``lease_expired``, an operator's ``replayed``, or a fenced-out attempt);
* no send began while the operator's pause held;
* no message has more copies than sends recorded for it (every send is counted);
* per ordering key, the messages in the stream or queue are in the order committed;
* every message whose delivering attempt began after the last recreate is there.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import redis
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from loadtest.broker_places import Got, Place, place
from loadtest.procs import Proc, clean_env
from poller import Event, Message, enqueue_many, publish_many
from poller.endpoints.registry import create_endpoint
from poller.local.brokers import EmbeddedNats, EmbeddedRabbitMQ
from poller.local.embedded import EmbeddedPostgres, EmbeddedRedis
from poller.operate.cancel import pause_endpoint, resume_endpoint
from poller.operate.replay import replay
from poller.service.server_watch import stop_at_exit
from poller.store import migrate
from poller.store.db import sync_engine

KINDS = ("nats", "amqp", "redis")
FACES = ("restart", "withhold", "recreate", "kill", "pause", "replay")
PAUSED = 1.5  # seconds the operator holds the endpoint
KEYS = 8
REQUEST_TIMEOUT = 1.0
WITHHELD = 2.5  # seconds a confirm is withheld: past the request timeout


@dataclass
class Plan:
    seed: int
    kind: str
    pollers: int
    faults: list[tuple[float, str]]
    max_attempts: int = 200

    @classmethod
    def draw(cls, seed: int, kind: str | None = None, duration: float = 8.0) -> Plan:
        rng = random.Random(seed)
        kind = kind or rng.choice(KINDS)
        faces = [rng.choice(FACES) for _ in range(rng.randint(2, 4))]
        times = sorted(rng.uniform(0.5, duration) for _ in faces)
        faults = list(zip(times, faces, strict=True))
        # the extreme budget: a message may end failed, never unsettled
        return cls(seed, kind, rng.choice((2, 3)), faults, rng.choice((200, 200, 2)))


@dataclass
class Run:
    plan: Plan
    committed: set[str] = field(default_factory=set)
    rolled_back: set[str] = field(default_factory=set)
    recreated_at: float = 0.0  # time.time() when the stream or queue last came back
    paused: list[tuple[float, float]] = field(default_factory=list)  # held, released
    faults_done: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


class Broker:
    """The seed's own server and what the faults do to it."""

    def __init__(self, kind: str, tmp: Path) -> None:
        self.kind = kind
        made = {"nats": EmbeddedNats, "amqp": EmbeddedRabbitMQ, "redis": EmbeddedRedis}[kind]
        (tmp / "broker").mkdir()
        self.server = made(tmp / "broker")
        stop_at_exit(self.server)

    def start(self) -> str:
        return self.server.start()

    def stop(self) -> None:
        self.server.stop()

    def restart(self) -> None:
        if self.kind == "redis":  # no persistence here: drop every connection instead
            with redis.Redis.from_url(self.server.url()) as client:
                client.client_kill_filter(_type="normal", skipme=True)
            return
        self.server.stop()
        self.server.start()

    def withhold(self) -> None:
        if self.kind == "redis":
            with redis.Redis.from_url(self.server.url()) as client:
                client.client_pause(int(WITHHELD * 1000), all=False)
            time.sleep(WITHHELD)
            return
        pid = self.server.pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(WITHHELD)
        finally:
            os.kill(pid, signal.SIGCONT)


def _feed(engine: Engine, run: Run, messages: int, seconds: float) -> None:
    """Commit ``messages`` over ``seconds``: a tenth rolled back, half ordered, a third
    published to the endpoint's subscription."""
    rng = random.Random(run.plan.seed + 1)
    batch, n = 20, 0
    pause = seconds / max(messages // batch, 1)
    while n < messages:
        keys = [f"h{run.plan.seed}-{n + i}" for i in range(batch)]
        roll_back = rng.random() < 0.1
        with Session(engine) as session:
            if rng.random() < 1 / 3:
                publish_many(session, [Event("hunt.tick", {"n": k}, k) for k in keys])
            else:
                enqueue_many(session, [
                    Message("dest", "hunt.tick", {"n": k}, k,
                            ordering_key=f"k{rng.randrange(KEYS)}" if rng.random() < 0.5 else None)
                    for k in keys
                ])  # fmt: skip
            if roll_back:
                session.rollback()
                run.rolled_back.update(keys)
            else:
                session.commit()
                run.committed.update(keys)
        n += batch
        time.sleep(pause)


def _open_rows(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(
            "SELECT count(*) FROM poller_outbox WHERE status NOT IN ('delivered', 'failed')"
        )).scalar_one())  # fmt: skip


def check(engine: Engine, run: Run, got: list[Got]) -> list[str]:
    """The invariants the module docstring lists; what is broken, in words."""
    with engine.connect() as conn:
        rows = {r.idempotency_key: r for r in conn.execute(text(
            "SELECT o.id, o.idempotency_key, o.status, o.ordering_key, "
            "(SELECT count(*) FROM poller_delivery_attempts a WHERE a.message_id = o.id "
            " AND a.kind = 'send') AS sends, "
            "(SELECT count(*) FROM poller_delivery_attempts a WHERE a.message_id = o.id "
            " AND (a.outcome IN ('unknown', 'lease_expired', 'replayed') OR a.stale))"
            " AS explained, "
            "(SELECT max(extract(epoch FROM a.started_at)) FROM poller_delivery_attempts a "
            " WHERE a.message_id = o.id AND a.outcome = 'delivered') AS delivered_started "
            "FROM poller_outbox o"
        ))}  # fmt: skip
        held = [conn.execute(text(
            "SELECT count(*) FROM poller_delivery_attempts WHERE kind = 'send' "
            "AND extract(epoch FROM started_at) BETWEEN :a AND :b"
        ), {"a": began + 0.2, "b": ended}).scalar_one() for began, ended in run.paused]  # fmt: skip
    copies: dict[str, int] = {}
    for g in got:
        copies[g.id] = copies.get(g.id, 0) + 1
    sent_while_paused = [f"{n} sends began while the operator's pause held" for n in held if n]
    return [*_settled(run, rows), *_copies(run, rows, copies), *_in_order(rows, got),
            *sent_while_paused]  # fmt: skip


def _settled(run: Run, rows: dict[str, Any]) -> list[str]:
    problems = []
    if missing := run.committed - rows.keys():
        problems.append(f"{len(missing)} committed messages not stored, e.g. {sorted(missing)[:3]}")
    if stored := run.rolled_back & rows.keys():
        problems.append(f"{len(stored)} rolled-back messages stored, e.g. {sorted(stored)[:3]}")
    if open_ := [k for k, r in rows.items() if r.status not in ("delivered", "failed")]:
        problems.append(f"{len(open_)} messages never settled, e.g. {open_[:3]}")
    return problems


def _copies(run: Run, rows: dict[str, Any], copies: dict[str, int]) -> list[str]:
    problems = []
    kind = run.plan.kind
    for key, count in copies.items():
        row = rows.get(key)
        if row is None:
            problems.append(f"{key} is in the {kind} stream but not in the outbox")
        elif count > 1 and kind != "amqp":
            problems.append(f"{key} is {count} times in the {kind} stream")
        elif count > 1 and not row.explained:
            problems.append(f"{key} queued {count} times with no unknown outcome to explain it")
        elif count > row.sends:
            problems.append(f"{key}: {count} copies but {row.sends} sends recorded")
    for key, row in rows.items():
        started = row.delivered_started
        after = row.status == "delivered" and started and started > run.recreated_at + 0.5
        if after and key not in copies:
            problems.append(f"{key} delivered after the last recreate but not in the stream")
    return problems


def _in_order(rows: dict[str, Any], got: list[Got]) -> list[str]:
    seen: dict[str, list[int]] = {}
    for g in got:
        row = rows.get(g.id)
        if row is not None and row.ordering_key is not None:
            order = seen.setdefault(row.ordering_key, [])
            if row.id not in order:
                order.append(row.id)
    return [
        f"key {key} out of order in the stream: {order[:10]}"
        for key, order in seen.items()
        if order != sorted(order)
    ]


async def _read(where: Place) -> list[Got]:
    await where.open()
    try:
        return await where.read()
    finally:
        await where.close()


def hunt(seed: int, messages: int, deadline: float, tmp: Path, kind: str | None = None) -> Run:
    """One seed's run; ``run.problems`` lists every broken invariant."""
    plan = Plan.draw(seed, kind)
    run = Run(plan)
    pg = EmbeddedPostgres(tmp / "pg", durable=False)
    stop_at_exit(pg)
    (tmp / "pg").mkdir()
    broker = Broker(plan.kind, tmp)
    fleet: list[Proc] = []
    try:
        db_url = pg.start()
        migrate.upgrade(db_url)
        engine = sync_engine(db_url)
        server = broker.start()
        where = place(plan.kind, {plan.kind: server})  # JetStream's window: an hour
        asyncio.run(_made(where))
        with engine.begin() as conn:
            create_endpoint(conn, "dest", where.url, allow_private=True,
                            max_attempts=plan.max_attempts,
                            # a key whose head failed would wait for an operator: skip it
                            on_failed_head="skip" if plan.max_attempts < 10 else "block",
                            event_types=["hunt.*"])  # fmt: skip
        env = clean_env(
            POLLER_DATABASE_URL=db_url,
            POLLER_SHARDS="4",
            POLLER_LEASE_TTL="1.5",
            POLLER_CLAIM_LEASE="3",
            POLLER_REQUEST_TIMEOUT=str(REQUEST_TIMEOUT),
            POLLER_CONNECT_TIMEOUT="0.5",
            POLLER_SWEEP_INTERVAL="0.3",
            POLLER_POLL_INTERVAL="0.3",
            POLLER_RETRY_SCHEDULE="[0.05, 0.2, 0.4]",
            POLLER_SHUTDOWN_GRACE="0.5",
            POLLER_ALLOW_PRIVATE_TARGETS="true",
            POLLER_LOG_FORMAT="json",
            POLLER_CIRCUIT_COOLDOWN="0.2",
            POLLER_CIRCUIT_COOLDOWN_MAX="0.8",
        )
        fleet = [
            Proc(["run", "--id", f"p{i}"], env, tmp / f"p{i}.log") for i in range(plan.pollers)
        ]
        began = time.monotonic()
        feeder = threading.Thread(target=_feed, args=(engine, run, messages, 6.0))
        feeder.start()
        for at, face in plan.faults:
            time.sleep(max(0.0, began + at - time.monotonic()))
            _fault(face, broker, where, fleet, run, engine)
        feeder.join()
        end = time.monotonic() + deadline
        while _open_rows(engine) and time.monotonic() < end:
            time.sleep(0.2)
        for proc in fleet:
            proc.stop()
        fleet = []
        run.problems += check(engine, run, asyncio.run(_read(where)))
        engine.dispose()
    except Exception as exc:
        run.problems.append(f"the hunt crashed: {type(exc).__name__}: {exc}")
    finally:
        for proc in fleet:
            proc.stop(graceful=False)
        broker.stop()
        pg.stop()
    return run


async def _made(where: Place) -> None:
    await where.open()
    try:
        await where.create()
    finally:
        await where.close()


def _fault(
    face: str, broker: Broker, where: Place, fleet: list[Proc], run: Run, engine: Engine
) -> None:
    if face == "pause":  # the operator's pause and resume, as the CLI runs them
        with engine.begin() as conn:
            pause_endpoint(conn, "dest", who="hunt")
        held = time.time()
        time.sleep(PAUSED)
        with engine.begin() as conn:
            resume_endpoint(conn, "dest")
        run.paused.append((held, time.time()))
    elif face == "replay":  # every event published so far, sent again
        replay(engine, "dest", since=datetime.now(UTC) - timedelta(minutes=10), who="hunt")
    elif face == "restart":
        broker.restart()
    elif face == "withhold":
        broker.withhold()
    elif face == "recreate":
        asyncio.run(_recreate(where))
        run.recreated_at = time.time()
    else:
        victim = fleet[random.Random(run.plan.seed + len(run.faults_done)).randrange(len(fleet))]
        victim.kill()
        victim.restart()
    run.faults_done.append(face)


async def _recreate(where: Place) -> None:
    await where.open()
    try:
        await where.remove()
        await asyncio.sleep(1.0)
        await where.create()
    finally:
        await where.close()


def summary(run: Run, seconds: float) -> str:
    plan = run.plan
    verdict = "ok" if not run.problems else "FAILED"
    head = (f"seed {plan.seed}: {verdict} — {plan.kind}, {plan.pollers} pollers, "
            f"max_attempts {plan.max_attempts}, "
            f"faults {', '.join(run.faults_done) or 'none'}, {len(run.committed)} committed, "
            f"{seconds:.0f} s")  # fmt: skip
    return "\n".join([head, *(f"  - {p}" for p in run.problems[:20])])


@contextlib.contextmanager
def _workdir(seed: int) -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix=f"poller-hunt-brokers-{seed}-") as tmp:
        yield Path(tmp)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, action="append", help="replay this seed")
    parser.add_argument("--seeds", type=int, default=6, help="how many random seeds")
    parser.add_argument("--messages", type=int, default=400)
    parser.add_argument("--deadline", type=float, default=120.0)
    parser.add_argument("--kind", choices=KINDS, help="this broker on every seed")
    args = parser.parse_args()
    seeds = args.seed or [random.randrange(2**31) for _ in range(args.seeds)]
    failed = []
    for seed in seeds:
        began = time.monotonic()
        with _workdir(seed) as tmp:
            run = hunt(seed, args.messages, args.deadline, tmp, args.kind)
        print(summary(run, time.monotonic() - began), flush=True)
        if run.problems:
            failed.append(seed)
            print(f"  replay: python -m loadtest.hunt_brokers --seed {seed} "
                  f"--messages {args.messages}", flush=True)  # fmt: skip
    print(json.dumps({"passed": len(seeds) - len(failed), "failed": failed}), flush=True)
    if failed:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
