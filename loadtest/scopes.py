"""The plain claim's time by a poller's share of the shards, over many endpoints.

    python -m loadtest.scopes [--endpoints 10000] [--runs 25]

ENDPOINTS endpoints over the 256 buckets, each with 3 due messages. CLAIM_BATCH
(a claim of 64, as the claim connection runs it: prepared, planned for all
values, each run rolled back) for a poller that leads every bucket, one shard of
8 (32 buckets, the default ``POLLER_SHARDS``), of 64 and of 256; then for one
shard of 8 whose own endpoints have nothing pending while the other shards'
have (a fleet whose load is uneven).

The claim walks the endpoints with pending messages in turn, through the
outbox's pending index led by the bucket, and jumps over the buckets it was not
given (poller/store/queries/claims.py): every scope should cost about the same, and an
idle shard less. Walked by endpoint (before migration 0024), a poller walked
past the other shards' endpoints: 1.3 ms for every bucket, 28 ms for a shard of
256, 40 ms for an idle shard of 8.
"""

from __future__ import annotations

import argparse

from sqlalchemy import text

from loadtest.bench_db import fresh_database, server_url
from loadtest.governed import PARAMS, _seed, median_ms, shard_buckets
from poller.rows.claims import ALL_BUCKETS_LITERAL
from poller.store import queries
from poller.store.db import sync_engine

SCOPES = {  # name -> (buckets, what is done first)
    "every bucket (one poller)": (ALL_BUCKETS_LITERAL, "SELECT 1"),
    "a shard of 8": (shard_buckets(8), "SELECT 1"),
    "a shard of 64": (shard_buckets(64), "SELECT 1"),
    "a shard of 256": (shard_buckets(256), "SELECT 1"),
    "a shard of 8, its own idle": (
        shard_buckets(8),
        "DELETE FROM poller_outbox WHERE bucket % 8 = 0",
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--endpoints", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=25, help="per scope (the first 3 warm up)")
    args = parser.parse_args()
    if not 1 <= args.endpoints <= 1_000_000 or not 4 <= args.runs <= 10_000:
        parser.error("--endpoints takes 1 to 1,000,000, --runs 4 to 10,000")
    with server_url() as admin:
        url = fresh_database(admin, "poller_bench")
        _seed(url, args.endpoints)
        engine = sync_engine(url)
        print(f"CLAIM_BATCH, a claim of 64, {args.endpoints:,} endpoints with 3 due each")
        for name, (buckets, first) in SCOPES.items():  # the last one deletes: it stays last
            with engine.begin() as conn:
                conn.execute(text(first))
            with engine.connect() as conn:
                conn.execution_options(isolation_level="AUTOCOMMIT").execute(text("VACUUM ANALYZE"))
            params = {**PARAMS, "buckets": buckets, "shards": 1}
            ms, claimed = median_ms(url, args.runs, queries.CLAIM_BATCH, params)
            print(f"{name:>28} {ms:8.2f} ms {claimed:4d} claimed")
        engine.dispose()


if __name__ == "__main__":
    main()
