"""The governed claim's time over many endpoints, by what governs them.

    python -m loadtest.governed [--endpoints 10000] [--runs 25]

ENDPOINTS endpoints, each with 3 due messages; then, one after the other, the
governed endpoints of each scenario (none; one rate limited; ten open circuits
past their cool-down; a thousand or all rate limited, with a token each, with
none, or one in a hundred with one). Each figure is the median wall time of
CLAIM_GOVERNED (a claim of 64) as the claim connection runs it — prepared once,
planned for all values (poller/store/db.py) — each run rolled back, so every run sees
the same rows. Then, with every endpoint rate limited (a token each; one in a
hundred with one) or behind an open circuit, the same claim by a poller's share
of the shards (as loadtest/scopes.py): what it costs and how many it finds, its
walk being bounded (GOVERNED_WALK).
"""

from __future__ import annotations

import argparse
import re
import statistics
import time
from collections.abc import Mapping
from typing import Any

import psycopg
from sqlalchemy import text

from loadtest.bench_db import fresh_database, server_url
from loadtest.fixtures import insert_due
from poller.endpoints.registry import create_endpoint
from poller.rows.claims import ALL_BUCKETS_LITERAL, LEAST_ID, NO_BUCKET, buckets_literal
from poller.store import queries
from poller.store.db import GENERIC_PLAN_SETTINGS, QUEUE_SETTINGS, libpq_url, sync_engine
from poller.store.schema import BUCKETS

PARAMS = {
    "buckets": ALL_BUCKETS_LITERAL,
    "limit": 64,
    "claimed_by": "bench",
    "claim_lease": 60.0,
    "in_flight": "[]",
    "default_max_in_flight": 16,
    "full_tenants": [],
    "after_bucket": NO_BUCKET,
    "after": LEAST_ID,
    "gafter_bucket": NO_BUCKET,
    "gafter": LEAST_ID,
    "fences": None,
    "shards": 1,
}
ALL_RATE_LIMITED = "UPDATE poller_endpoints SET rate_limit = 1"
SCENARIOS = {  # what governs the endpoints (after a reset: none governed, no token)
    "none governed": "SELECT 1",
    "1 rate limited": "UPDATE poller_endpoints SET rate_limit = 100 "
    "WHERE id = (SELECT min(id) FROM poller_endpoints)",
    "10 open circuits": "UPDATE poller_endpoint_health SET state = 'open', open_until = now() "
    "WHERE endpoint_id IN (SELECT id FROM poller_endpoints ORDER BY id LIMIT 10)",
    "1,000 rate limited, a token each": "UPDATE poller_endpoints SET rate_limit = 1 "
    "WHERE id IN (SELECT id FROM poller_endpoints ORDER BY id LIMIT 1000);"
    "UPDATE poller_endpoint_health SET tokens = 1",
    "all rate limited, a token each": f"{ALL_RATE_LIMITED};"
    "UPDATE poller_endpoint_health SET tokens = 1",
    "all rate limited, no token": "UPDATE poller_endpoints SET rate_limit = 0.001",
    "all rate limited, 1 in 100 a token": "UPDATE poller_endpoints SET rate_limit = 0.001;"
    "UPDATE poller_endpoint_health SET tokens = 1 WHERE endpoint_id % 100 = 0",
}
BY_SCOPE = {  # scenarios measured by a poller's share of the shards
    "all rate limited, a token each": SCENARIOS["all rate limited, a token each"],
    # one in a hundred by a hash: ``endpoint_id % 100`` picks none of some shards
    "all rate limited, 1 in 100 a token": "UPDATE poller_endpoints SET rate_limit = 0.001;"
    "UPDATE poller_endpoint_health SET tokens = 1 WHERE hashint8(endpoint_id) % 100 = 0",
    "all open circuits": "UPDATE poller_endpoint_health SET state = 'open', open_until = now()",
}
RESET = (
    "UPDATE poller_endpoints SET rate_limit = NULL;"
    "UPDATE poller_endpoint_health SET state = 'closed', tokens = 0, tokens_at = now()"
)


def shard_buckets(shards: int) -> str:
    """The buckets of shard 0 of ``shards``, as a claim's literal."""
    return buckets_literal([b for b in range(BUCKETS) if b % shards == 0])


def _seed(url: str, endpoints: int) -> None:
    engine = sync_engine(url)
    with engine.begin() as conn:
        create_endpoint(conn, "bench-0", "http://127.0.0.1:9/", allow_private=True)
        conn.execute(
            text(
                "INSERT INTO poller_endpoints (name, url, secret, bucket)"
                " SELECT 'bench-' || g, url, secret, CAST(g % 256 AS smallint)"
                " FROM poller_endpoints, generate_series(1, :n) AS g"
            ),
            {"n": endpoints - 1},
        )
        for endpoint_id, bucket in conn.execute(text("SELECT id, bucket FROM poller_endpoints")):
            insert_due(conn, endpoint_id, bucket, 3, prefix=f"{endpoint_id}:", pad=50)
    engine.dispose()


def median_ms(
    url: str,
    runs: int,
    statement: queries.Statement = queries.CLAIM_GOVERNED,
    params: Mapping[str, Any] = PARAMS,
) -> tuple[float, int]:
    """A claim statement's median time and the rows it claimed (the same every run);
    CLAIM_GOVERNED's with its second step, SPEND_TOKENS, in its transaction."""
    numbers: dict[str, int] = {}
    sql = re.sub(  # the psycopg text, its parameters numbered for PREPARE
        r"%\((\w+)\)s",
        lambda m: f"${numbers.setdefault(m.group(1), len(numbers) + 1)}",
        statement.psycopg,
    ).replace("%%", "%")
    values = [params[name] for name in numbers]
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        for setting in QUEUE_SETTINGS + GENERIC_PLAN_SETTINGS:
            conn.execute(setting)
        conn.execute(f"PREPARE governed AS {sql}")
        spend = queries.SPEND_TOKENS.psycopg
        cursor = psycopg.ClientCursor(conn)
        execute = "EXECUTE governed(" + ", ".join(["%s"] * len(values)) + ")"
        timings, claimed = [], 0
        for _ in range(runs):
            conn.execute("BEGIN")
            began = time.perf_counter()
            cursor.execute(execute, values)
            rows = cursor.fetchall()
            names = [c.name for c in cursor.description or ()]
            if "spend" in names and rows[0][names.index("spend")] != "[]":  # its second step
                conn.execute(spend, {"spend": rows[0][names.index("spend")]})
            claimed = sum(1 for row in rows if row[0] is not None)
            timings.append((time.perf_counter() - began) * 1000)
            conn.execute("ROLLBACK")
    return statistics.median(timings[3:]), claimed


def govern(engine: Any, statements: str) -> None:
    """Reset what governs the endpoints, then run ``statements`` (``;`` between them),
    then VACUUM ANALYZE, as every scenario starts."""
    with engine.begin() as conn:
        for statement in (RESET + ";" + statements).split(";"):
            conn.execute(text(statement))
    with engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").execute(text("VACUUM ANALYZE"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--endpoints", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=25, help="per scenario (the first 3 warm up)")
    args = parser.parse_args()
    if not 1 <= args.endpoints <= 1_000_000 or not 4 <= args.runs <= 10_000:
        parser.error("--endpoints takes 1 to 1,000,000, --runs 4 to 10,000")
    with server_url() as admin:
        url = fresh_database(admin, "poller_bench")
        _seed(url, args.endpoints)
        engine = sync_engine(url)
        print(f"CLAIM_GOVERNED, a claim of 64, {args.endpoints:,} endpoints with 3 due each")
        for name, statements in SCENARIOS.items():
            govern(engine, statements)
            ms, claimed = median_ms(url, args.runs)
            print(f"{name:>36} {ms:8.2f} ms {claimed:4d} claimed")
        print("\nby a poller's share of the shards")
        for name, statements in BY_SCOPE.items():
            govern(engine, statements)
            for scope, shards in (("every bucket", 1), ("a shard of 8", 8), ("of 256", 256)):
                params = {**PARAMS, "buckets": shard_buckets(shards)}
                ms, claimed = median_ms(url, args.runs, params=params)
                label = f"{name}, {scope}"
                print(f"{label:>52} {ms:8.2f} ms {claimed:4d} claimed")
        engine.dispose()


if __name__ == "__main__":
    main()
