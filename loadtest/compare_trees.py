"""CPU per delivery of this tree's `poller run` against another commit's, draining to one
real broker in turns: how to see a change of a few per cent on a machine whose speed
moves by a fifth from one minute to the next.

    python -m loadtest.compare_trees BASE [--kind nats|amqp|redis] [--messages 5000]
                                          [--rounds 14]

BASE (a commit or a branch) is checked out into a temporary git worktree. Two `poller
run` processes, one from each tree, each with a database of its own (migrated by its
own tree) and an endpoint on one broker of the run's own (poller/local/brokers.py),
drain --messages committed at once, in turns — A then B in even rounds, B then A in odd
ones — and each drain's CPU per delivery (user + system of the poller's process tree)
is recorded. Both sides meet the same machine within seconds of each other; the table
gives each side's median and their ratio, below 1 when this tree spends less.
Both pollers stay idle between their drains, so what one spends never lands on the
other's count. The messages are committed by this tree's library into both databases:
BASE must read the same outbox (a commit whose migrations differ may not).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import uvloop
from sqlalchemy import Engine

from loadtest.bench_db import server_url
from loadtest.brokers_bench import _prepare, _url
from loadtest.deliveries import drain
from loadtest.procs import Proc, clean_env, tree_cpu_seconds
from poller.endpoints.registry import create_endpoint, new_secret
from poller.local.brokers import EmbeddedNats, EmbeddedRabbitMQ
from poller.local.embedded import EmbeddedRedis
from poller.service.server_watch import stop_at_exit
from poller.store.db import sync_engine

ROOT = Path(__file__).resolve().parent.parent


def _database(admin: str, name: str, tree: Path) -> str:
    """A new database ``name``, migrated by ``tree``'s own migrations."""
    base, _, rest = admin.rpartition("/")
    query = rest.partition("?")[2]
    url = f"{base}/{name}" + (f"?{query}" if query else "")
    script = (
        "import sys, psycopg\n"
        "from poller.store import migrate\n"
        "from poller.store.db import libpq_url\n"
        "admin, url, name = sys.argv[1:]\n"
        "with psycopg.connect(libpq_url(admin), autocommit=True) as conn:\n"
        "    conn.execute(f'DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)')\n"
        "    conn.execute(f'CREATE DATABASE \"{name}\"')\n"
        "migrate.upgrade(url)\n"
    )
    subprocess.run([sys.executable, "-c", script, admin, url, name], cwd=tree, check=True)
    return url


def _side(
    admin: str, label: str, tree: Path, kind: str, server: str, tmp: Path
) -> tuple[Engine, Proc]:
    url = _database(admin, f"compare_{label.lower()}", tree)
    engine = sync_engine(url)
    with engine.begin() as conn:
        create_endpoint(conn, "bench", _url(kind, server), secret=new_secret(),
                        max_in_flight=64, allow_private=True)  # fmt: skip
    env = clean_env(POLLER_DATABASE_URL=url, POLLER_CONCURRENCY="64",
                    POLLER_ALLOW_PRIVATE_TARGETS="true", POLLER_BATCH_SIZE="100")  # fmt: skip
    poller = Proc(["run", "--id", f"compare{label}"], env, tmp / f"{label}.log", cwd=tree)
    poller.wait_for("starting")
    return engine, poller


def _drain(engine: Engine, poller: Proc, kind: str, server: str, n: int, prefix: str) -> float:
    """CPU µs per delivery of one drain of ``n`` messages."""
    uvloop.run(_prepare(kind, server))
    before = tree_cpu_seconds(poller.popen.pid)
    drain(engine, n, timeout=300, prefix=prefix)
    return 1e6 * (tree_cpu_seconds(poller.popen.pid) - before) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("base", help="the commit or branch to compare this tree with")
    parser.add_argument("--kind", choices=("nats", "amqp", "redis"), default="nats")
    parser.add_argument("--messages", type=int, default=5_000)
    parser.add_argument("--rounds", type=int, default=14)
    args = parser.parse_args()
    made: dict[str, type[EmbeddedNats | EmbeddedRabbitMQ | EmbeddedRedis]] = {
        "nats": EmbeddedNats, "amqp": EmbeddedRabbitMQ, "redis": EmbeddedRedis,
    }  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="poller-compare-") as folder, server_url() as admin:
        tmp = Path(folder)
        base = tmp / "base"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(base),
                        args.base], check=True)  # fmt: skip
        (tmp / "broker").mkdir()
        broker = made[args.kind](tmp / "broker")
        stop_at_exit(broker)
        sides: dict[str, tuple[Engine, Proc]] = {}
        try:
            server = broker.start()
            uvloop.run(_prepare(args.kind, server))
            for label, tree in (("A", base), ("B", ROOT)):
                sides[label] = _side(admin, label, tree, args.kind, server, tmp)
            time.sleep(1.0)  # a warm-up, not synchronisation: both already run
            spent: dict[str, list[float]] = {"A": [], "B": []}
            for label in "AB":
                _drain(*sides[label], args.kind, server, 2_000, f"warm{label}")
            for round_ in range(args.rounds):
                for label in "AB" if round_ % 2 == 0 else "BA":
                    prefix = f"{label}{round_}"
                    spent[label].append(_drain(*sides[label], args.kind, server,
                                               args.messages, prefix))  # fmt: skip
                print(f"  round {round_ + 1}: A {spent['A'][-1]:.0f}, "
                      f"B {spent['B'][-1]:.0f} µs a delivery", flush=True)  # fmt: skip
        finally:
            for engine, poller in sides.values():
                poller.stop()
                engine.dispose()
            broker.stop()
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)],
                           check=False)  # fmt: skip
    a, b = statistics.median(spent["A"]), statistics.median(spent["B"])
    print(f"\n{args.kind}, {args.messages:,} messages a drain, medians of {args.rounds}")
    print("| tree | µs of poller CPU a delivery |\n| --- | ---: |")
    print(f"| A: {args.base} | {a:.0f} |\n| B: this tree | {b:.0f} |\n| B / A | {b / a:.2f} |")


if __name__ == "__main__":
    main()
