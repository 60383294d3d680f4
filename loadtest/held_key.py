"""What an application transaction left open on an ordering key costs the poller.

    python -m loadtest.held_key [--hold 20] [--messages 2000] [--lease 5]

One `poller run` process and the reference receiver. Key K has a head message
committed; an application transaction enqueues K's next message and stays open
for --hold seconds (an external call, a bulk import), while --messages unordered
messages to the same endpoint are committed and the poller starts. K's head is
delivered meanwhile, so its completion has to hand K on while the application
holds K. Claim lease --lease seconds, no lookup URL (so an expired claim is sent
again: every expiry is a duplicate POST).

Printed: the unordered messages delivered while the transaction was open, lease
expiries and duplicate POSTs at the receiver during the whole run, and whether
K's messages were delivered, in order, after the commit. Before completions
stopped waiting on key rows this was 0 delivered, 3,985 expiries and 3,985
duplicate POSTs for 20 s / 2,000 / 5 s.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import text
from sqlalchemy.orm import Session

from loadtest.bench_db import fresh_database, server_url
from loadtest.deliveries import start_receiver
from loadtest.procs import Proc, clean_env
from poller import Message, enqueue_many
from poller.endpoints.registry import create_endpoint, new_secret
from poller.store.db import sync_engine


def _count(engine: Any, sql: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(sql)).scalar_one())


def run(admin_url: str, tmp: Path, receiver_url: str, secret: str, args: Any) -> dict[str, Any]:
    url = fresh_database(admin_url, "bench_held_key")
    engine = sync_engine(url)
    with engine.begin() as conn:
        create_endpoint(conn, "shop", f"{receiver_url}/shop", secret=secret, allow_private=True)
    with Session(engine) as session, session.begin():
        enqueue_many(session, [Message("shop", "order.changed", {"n": 0}, "K:0", ordering_key="K")])
    application = Session(engine)
    application.begin()
    enqueue_many(application, [Message("shop", "order.changed", {"n": 1}, "K:1", ordering_key="K")])
    with Session(engine) as session, session.begin():
        enqueue_many(
            session,
            [Message("shop", "bench.event", {"n": i}, f"free:{i}") for i in range(args.messages)],
        )
    env = clean_env(
        POLLER_DATABASE_URL=url,
        POLLER_ALLOW_PRIVATE_TARGETS="true",
        POLLER_CLAIM_LEASE=str(args.lease),
        POLLER_REQUEST_TIMEOUT=str(min(10.0, (args.lease - 1) / 2)),
        POLLER_SWEEP_INTERVAL="1",
    )
    poller = Proc(["run", "--id", "held-key"], env, tmp / "poller.log")
    held_until = time.monotonic() + args.hold
    try:
        poller.wait_for("starting")
        while time.monotonic() < held_until:  # the application's slow work
            time.sleep(0.1)
        free = (
            "SELECT count(*) FROM poller_outbox WHERE status = 'delivered' AND ordering_key IS NULL"
        )
        during = _count(engine, free)
        application.commit()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if (
                _count(engine, "SELECT count(*) FROM poller_outbox WHERE status <> 'delivered'")
                == 0
            ):
                break
            time.sleep(0.2)
        expired = _count(
            engine, "SELECT count(*) FROM poller_delivery_attempts WHERE outcome = 'lease_expired'"
        )
        order = _count(
            engine,
            "SELECT count(*) FROM poller_outbox WHERE ordering_key = 'K' AND status = 'delivered'",
        )
    finally:
        application.close()
        poller.stop()
        engine.dispose()
    stats = httpx.get(f"{receiver_url}/stats").json()
    return {
        "during": during,
        "expired": expired,
        "duplicates": stats["duplicates"],
        "k_delivered": order,
        "order_violations": stats["order_violations"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hold", type=float, default=20.0)
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--lease", type=float, default=5.0)
    args = parser.parse_args()
    secret = new_secret()
    with tempfile.TemporaryDirectory(prefix="poller-held-key-") as tmpdir, server_url() as admin:
        tmp = Path(tmpdir)
        receiver, receiver_url = start_receiver(tmp, secret, "receiver")
        try:
            found = run(admin, tmp, receiver_url, secret, args)
        finally:
            receiver.stop()
    print(
        f"transaction held {args.hold:g}s on K, {args.messages:,} other messages, "
        f"claim lease {args.lease:g}s:\n"
        f"  delivered while it was open  {found['during']:>6,} of {args.messages:,}\n"
        f"  lease expiries               {found['expired']:>6,}\n"
        f"  duplicate POSTs              {found['duplicates']:>6,}\n"
        f"  K's 2 messages delivered     {found['k_delivered']:>6,}, "
        f"order violations {found['order_violations']}"
    )


if __name__ == "__main__":
    main()
