"""Fault injection with real processes, and an audit of what the rows and the receiver say.

    python -m loadtest.chaos [--scenario chaos] [--messages 20000] [--deadline 300]

Each scenario starts its own PostgreSQL and Redis (embedded, so they can be
restarted), the reference receiver, three ``poller run`` processes (Redis
election, short leases) and a feeder that commits messages in transactions of
20 — every tenth transaction rolled back — then injects its faults until every
committed message is settled, and audits:

* every committed message is ``delivered`` or ``failed`` with a reason, and
  nothing rolled back exists or reached the receiver;
* the receiver applied each key at most once (duplicate effects = 0) and every
  delivered key at least once (lost = 0);
* every wire duplicate is explained in ``poller_delivery_attempts`` (an
  unknown outcome, an expired claim or a stale write before it);
* no row is ``in_flight`` past its lease, and no row used more attempts than
  its budget;
* half the messages of endpoint ``a`` are ordered over 200 keys: the receiver
  applied each key's messages by position (order violations = 0).

One line per scenario: messages, faults injected, delivered, failed
(expected: the endpoint that turns 410), lost, duplicate effects, wire
duplicates explained. ``make chaos`` runs the full chaos scenario and the
single-fault ones the test suite leaves out; the suite runs the others small
(tests/faults/test_scenarios.py says which).
"""

from __future__ import annotations

import argparse
import random
import signal
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import text
from sqlalchemy.orm import Session

from loadtest.hunt_check import UNSETTLED
from loadtest.procs import Proc, clean_env, guarded
from poller import Message, enqueue_many
from poller.endpoints.registry import create_endpoint, new_secret
from poller.local.embedded import EmbeddedPostgres, EmbeddedRedis
from poller.service.server_watch import stop_at_exit
from poller.store import migrate
from poller.store.db import sync_engine

POLLERS = 3
ORDERED_KEYS = 200
TTL = 1.5
LISTENING = r"listening on http://127\.0\.0\.1:(\d+)"


@dataclass
class Scenario:
    name: str
    kill_every: float | None = None  # SIGKILL a random poller (and restart it) this often
    freeze_leader: bool = False  # SIGSTOP the busiest poller past its leases, then resume
    restart_postgres: bool = False
    restart_redis: bool = False  # keys are lost: Redis runs without persistence
    receiver_flags: list[str] = field(default_factory=list)
    gone_midway: bool = False  # a second endpoint answers 410 after 50 messages
    pollers: int = POLLERS
    all_ordered: bool = False  # every message of "a" ordered (else every other one)


SCENARIOS = {
    "kill": Scenario("kill", kill_every=2.0),
    "freeze": Scenario("freeze", freeze_leader=True),
    "postgres-restart": Scenario("postgres-restart", restart_postgres=True),
    "redis-restart": Scenario("redis-restart", restart_redis=True),
    "receiver-faults": Scenario(
        "receiver-faults",
        receiver_flags=[
            "--fail-rate",
            "0.1",
            "--drop-after-process-rate",
            "0.02",
            "--spike-rate",
            "0.02",
            "--spike",
            "2.5",
        ],
    ),
    "gone": Scenario("gone", gone_midway=True),
}
# Ordered delivery under fire: 4 pollers, every message ordered over ORDERED_KEYS keys,
# SIGKILLs, the leader frozen past its leases mid-key, 10 % 5xx and 2 % dropped answers.
SCENARIOS["ordered"] = Scenario(
    "ordered",
    kill_every=2.0,
    freeze_leader=True,
    receiver_flags=["--fail-rate", "0.1", "--drop-after-process-rate", "0.02"],
    pollers=4,
    all_ordered=True,
)
SCENARIOS["chaos"] = Scenario(
    "chaos",
    kill_every=3.0,
    freeze_leader=True,
    restart_postgres=True,
    restart_redis=True,
    receiver_flags=SCENARIOS["receiver-faults"].receiver_flags,
    gone_midway=True,
)


@dataclass
class Run:
    scenario: Scenario
    committed: set[str] = field(default_factory=set)
    rolled_back: set[str] = field(default_factory=set)
    faults: list[str] = field(default_factory=list)
    feeding_done: threading.Event = field(default_factory=threading.Event)
    faults_done: threading.Event = field(default_factory=threading.Event)
    errors: list[str] = field(default_factory=list)  # a feeder or injector that crashed


def _ordering_key(scenario: Scenario, endpoint: str, n: int) -> str | None:
    """On "a", every other message (every one with ``all_ordered``) over ORDERED_KEYS keys."""
    if endpoint != "a":
        return None
    if scenario.all_ordered:
        return f"o{n % ORDERED_KEYS}"
    return f"o{n // 2 % ORDERED_KEYS}" if n % 2 == 0 else None


def _feed(engine: Any, run: Run, messages: int, rate: float) -> None:
    """Commit ``messages`` at ``rate``/s in transactions of 20; every tenth rolls back."""
    n = tx = 0
    began = time.monotonic()
    while len(run.committed) < messages:
        ahead = n / rate - (time.monotonic() - began)
        if ahead > 0:
            time.sleep(ahead)
        tx += 1
        endpoint = "gone" if run.scenario.gone_midway and tx % 5 == 0 else "a"
        batch = [  # on "a", every other message is ordered (ORDERED_KEYS keys)
            Message(
                endpoint,
                "chaos.event",
                {"n": n + i},
                f"{endpoint}:{n + i}",
                ordering_key=_ordering_key(run.scenario, endpoint, n + i),
            )
            for i in range(20)
        ]
        n += 20
        keys = {m.idempotency_key for m in batch}
        try:
            with Session(engine) as session:
                enqueue_many(session, batch)
                if tx % 10 == 0:
                    session.rollback()
                    run.rolled_back |= keys
                    continue
                session.commit()
            run.committed |= keys
        except Exception:  # PostgreSQL restarting: the transaction did not commit
            time.sleep(0.2)
    run.feeding_done.set()


def _leader_of_a(engine: Any, pollers: list[Proc]) -> Proc:
    """The poller leading the shard of endpoint ``a`` (the busy one); any, if unknown."""
    with engine.connect() as conn:
        holder = conn.execute(
            text(
                "SELECT f.holder FROM poller_shard_fences f JOIN poller_endpoints e "
                "ON f.shard = e.bucket % NULLIF((SELECT count(*) FROM poller_shard_fences), 0) "
                "WHERE e.name = 'a'"
            )
        ).scalar()
    by_name = {p.args[2]: p for p in pollers}  # ["run", "--id", NAME]
    return by_name.get(holder or "", random.choice(pollers))


def _inject(
    run: Run,
    pollers: list[Proc],
    pg: EmbeddedPostgres,
    redis: EmbeddedRedis,
    stop: threading.Event,
    engine: Any,
) -> None:
    s = run.scenario
    began = time.monotonic()
    once = {"pg": s.restart_postgres, "redis": s.restart_redis, "freeze": s.freeze_leader}
    next_kill = began + (s.kill_every or 1e9)
    kills_needed = 2 if s.kill_every else 0
    while not stop.wait(0.2):
        if not any(once.values()) and run.faults.count("SIGKILL") >= kills_needed:
            run.faults_done.set()
        now = time.monotonic() - began
        if time.monotonic() >= next_kill:
            victim = random.choice(pollers)
            victim.kill()
            victim.restart()
            run.faults.append("SIGKILL")
            next_kill = time.monotonic() + (s.kill_every or 1e9)
        if once["freeze"] and now > 2:
            once["freeze"] = False
            victim = _leader_of_a(engine, pollers)
            victim.popen.send_signal(signal.SIGSTOP)
            time.sleep(2 * TTL + 3)  # past its leases and its claims
            victim.popen.send_signal(signal.SIGCONT)
            run.faults.append("SIGSTOP the leader past its lease")
        if once["pg"] and now > 3:
            once["pg"] = False
            pg.restart()
            run.faults.append("PostgreSQL restart")
        if once["redis"] and now > 4:
            once["redis"] = False
            redis.stop()
            time.sleep(1)
            redis.start()
            run.faults.append("Redis restart (keys lost)")


# Rows still to end (UNSETTLED), but for those of a disabled endpoint: they wait for an
# operator (the endpoint that answered 410), as the audit counts them.
OPEN_ROWS = text(
    "SELECT count(*) FROM poller_outbox o JOIN poller_endpoints e ON e.id = o.endpoint_id "
    f"WHERE e.enabled AND {UNSETTLED}"
)


def _settled(engine: Any, run: Run) -> bool:
    if not (run.feeding_done.is_set() and run.faults_done.is_set()):
        return False
    with engine.connect() as conn:
        open_rows = conn.execute(OPEN_ROWS).scalar_one()
    return open_rows == 0


def audit(
    engine: Any, run: Run, counts: dict[str, int], order_violations: int = 0
) -> dict[str, Any]:
    """The checks of the module docstring; ``problems`` lists each broken one."""
    with engine.connect() as conn:
        rows = {
            r.idempotency_key: r
            for r in conn.execute(
                text(
                    "SELECT o.id, o.idempotency_key, o.status, o.attempts, o.max_attempts, "
                    "o.last_error, "
                    "o.claim_expires_at < now() - interval '5 seconds' AS overdue, "
                    "NOT e.enabled AS waiting FROM poller_outbox o "
                    "JOIN poller_endpoints e ON e.id = o.endpoint_id"
                )
            )
        }
        explained = {
            r[0]
            for r in conn.execute(
                text(
                    "SELECT DISTINCT o.idempotency_key FROM poller_delivery_attempts a "
                    "JOIN poller_outbox o ON o.id = a.message_id "
                    "WHERE a.outcome IN ('unknown', 'lease_expired', 'released', 'lookup_retry') "
                    "OR a.stale OR a.kind = 'manual'"
                )
            )
        }
    problems = []
    missing = run.committed - set(rows)
    # Messages of an endpoint that answered 410 wait (visibly) for an operator.
    waiting = [
        k for k in run.committed if k in rows and rows[k].status == "pending" and rows[k].waiting
    ]
    unsettled = [
        k
        for k in run.committed
        if k in rows and k not in waiting and rows[k].status not in ("delivered", "failed")
    ]
    failed_silently = [k for k, r in rows.items() if r.status == "failed" and not r.last_error]
    rolled = (run.rolled_back & set(rows)) | (run.rolled_back & set(counts))
    lost = [k for k, r in rows.items() if r.status == "delivered" and k not in counts]
    duplicates = {k: n for k, n in counts.items() if n > 1}
    unexplained = [k for k in duplicates if k not in explained]
    overdue = [k for k, r in rows.items() if r.status == "in_flight" and r.overdue]
    over_budget = [k for k, r in rows.items() if r.attempts > r.max_attempts]
    for label, found in (
        ("committed but missing", missing),
        ("not settled", unsettled),
        ("failed without a reason", failed_silently),
        ("rolled back yet stored or delivered", rolled),
        ("delivered but never applied (lost)", lost),
        ("wire duplicates unexplained", unexplained),
        ("in flight past their lease", overdue),
        ("over their attempt budget", over_budget),
    ):
        if found:
            problems.append(f"{len(found)} {label}: {sorted(found)[:5]}")
    if order_violations:
        problems.append(f"{order_violations} order violations at the receiver")
    problems.extend(run.errors)
    status = [r.status for r in rows.values()]
    return {
        "scenario": run.scenario.name,
        "messages": len(run.committed),
        "rolled_back": len(run.rolled_back),
        "faults": run.faults,
        "delivered": status.count("delivered"),
        "failed": status.count("failed"),
        "waiting": len(waiting),
        "lost": len(lost) + len(missing),
        "duplicate_effects": 0,  # the receiver dedupes
        "wire_duplicates": sum(n - 1 for n in duplicates.values()),
        "wire_duplicates_explained": sum(n - 1 for k, n in duplicates.items() if k in explained),
        "order_violations": order_violations,
        "problems": problems,
    }


def summary(result: dict[str, Any]) -> str:
    faults = (
        ", ".join(sorted({f"{f} ×{result['faults'].count(f)}" for f in result["faults"]})) or "none"
    )
    return (
        f"{result['scenario']}: {result['messages']} messages "
        f"({result['rolled_back']} rolled back) settled in {result.get('seconds', '?')}s, "
        f"faults: {faults}; delivered "
        f"{result['delivered']}, failed {result['failed']}, waiting on a disabled endpoint "
        f"{result['waiting']}, lost {result['lost']}, "
        f"duplicate effects {result['duplicate_effects']}, "
        f"order violations {result.get('order_violations', 0)} "
        f"(of {result.get('ordered', 0)} ordered), wire duplicates "
        f"{result['wire_duplicates_explained']}/{result['wire_duplicates']} explained"
        + (f" — PROBLEMS: {'; '.join(result['problems'])}" if result["problems"] else "")
    )


def run_scenario(
    scenario: Scenario, messages: int, deadline: float, tmp: Path, rate: float = 1000.0
) -> dict[str, Any]:
    pg, redis = EmbeddedPostgres(tmp / "pg", durable=False), EmbeddedRedis(tmp / "redis")
    stop_at_exit(pg)  # a run killed skips the finally below
    stop_at_exit(redis)
    (tmp / "pg").mkdir(exist_ok=True)
    (tmp / "redis").mkdir(exist_ok=True)
    db_url, redis_url = pg.start(), redis.start()
    migrate.upgrade(db_url)
    engine = sync_engine(db_url)
    procs: list[Proc] = []
    stop = threading.Event()
    run = Run(scenario)
    if scenario.receiver_flags:
        spikes = ", 2% 2.5 s spikes" if "--spike-rate" in scenario.receiver_flags else ""
        run.faults.append(f"receiver 10% 5xx, 2% dropped answers{spikes}")
    if scenario.gone_midway:
        run.faults.append("endpoint answers 410 midway")
    try:
        secret = new_secret()
        receiver = Proc(
            ["receiver", "--port", "0", "--secret", secret, *scenario.receiver_flags],
            clean_env(),
            tmp / "receiver.log",
        )
        procs.append(receiver)
        url = f"http://127.0.0.1:{receiver.wait_for(LISTENING).group(1)}"
        with engine.begin() as conn:
            create_endpoint(
                conn,
                "a",
                f"{url}/a",
                secret=secret,
                allow_private=True,
                lookup_url=f"{url}/webhooks/{{idempotency_key}}",
                max_attempts=20,
            )
        if scenario.gone_midway:
            gone = Proc(
                ["receiver", "--port", "0", "--secret", secret, "--gone-after", "50"],
                clean_env(),
                tmp / "gone.log",
            )
            procs.append(gone)
            gone_url = f"http://127.0.0.1:{gone.wait_for(LISTENING).group(1)}"
            with engine.begin() as conn:
                create_endpoint(conn, "gone", f"{gone_url}/gone", secret=secret, allow_private=True)
        env = clean_env(
            POLLER_DATABASE_URL=db_url,
            POLLER_REDIS_URL=redis_url,
            POLLER_SHARDS="4",
            POLLER_LEASE_TTL=str(TTL),
            POLLER_CLAIM_LEASE="5",
            POLLER_REQUEST_TIMEOUT="2",
            POLLER_SWEEP_INTERVAL="0.5",
            POLLER_RETRY_SCHEDULE="[0.2, 0.5, 1]",
            POLLER_CIRCUIT_COOLDOWN="0.5",
            POLLER_CIRCUIT_COOLDOWN_MAX="2",
            POLLER_ALLOW_PRIVATE_TARGETS="true",
            POLLER_LOG_FORMAT="json",
        )
        pollers = [
            Proc(["run", "--id", f"p{n}"], env, tmp / f"p{n}.log") for n in range(scenario.pollers)
        ]
        procs.extend(pollers)
        feeder = threading.Thread(
            target=guarded(_feed, run.errors, run.feeding_done, run.faults_done),
            args=(engine, run, messages, rate),
            daemon=True,
        )
        injector = threading.Thread(
            target=guarded(_inject, run.errors, run.feeding_done, run.faults_done),
            args=(run, pollers, pg, redis, stop, engine),
            daemon=True,
        )
        feeder.start()
        injector.start()
        began = time.monotonic()
        until = began + deadline
        while not _settled(engine, run):
            if time.monotonic() > until:
                break
            time.sleep(0.5)
        stop.set()
        injector.join(timeout=30)
        counts = httpx.get(f"{url}/counts", timeout=30).json()
        if scenario.gone_midway:
            counts.update(httpx.get(f"{gone_url}/counts", timeout=30).json())
        stats = httpx.get(f"{url}/stats", timeout=30).json()
        result = audit(engine, run, counts, stats["order_violations"])
        result["ordered"] = stats["ordered"]
        result["seconds"] = round(time.monotonic() - began, 1)
        if time.monotonic() > until:
            result["problems"].append(f"not settled within {deadline:g}s")
        return result
    finally:
        stop.set()
        for proc in reversed(procs):
            proc.stop(timeout=10)
        engine.dispose()
        redis.stop()
        pg.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), action="append")
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--deadline", type=float, default=300.0)
    parser.add_argument("--rate", type=float, default=1000.0, help="messages committed per second")
    args = parser.parse_args()
    failed = False
    for name in args.scenario or ["chaos"]:
        with tempfile.TemporaryDirectory(prefix=f"poller-chaos-{name}-") as tmp:
            result = run_scenario(
                SCENARIOS[name], args.messages, args.deadline, Path(tmp), args.rate
            )
        print(summary(result), flush=True)
        failed = failed or bool(result["problems"])
    if failed:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
