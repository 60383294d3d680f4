"""How fast the dashboard's pages answer on a 1,000,000-row outbox.

    python -m loadtest.dashboard [--rows 1000000] [--endpoints 100] [--runs 15]

Seeds ROWS messages over ENDPOINTS endpoints (90 % delivered, 8 % failed, 2 %
pending) and an attempt for one in five of the ended ones, all in the last hour
(a heavy hour: 200,000 attempts), inserted in time order as a poller writes
them; then times whole requests through the app
(authentication, queries, rendering), median and worst of RUNS: the overview,
the failed list (first page, a page 100 pages in by keyset, one endpoint's, an
error search), a message, the endpoints and blocked keys. Target: the overview
under 200 ms.
"""

from __future__ import annotations

import argparse
import re
import statistics
import time

from sqlalchemy import text
from starlette.testclient import TestClient

from loadtest.bench_db import fresh_database, server_url
from poller.endpoints.registry import create_endpoint
from poller.settings import load_settings
from poller.store.db import sync_engine
from poller.web import auth
from poller.web.app import create_app

TOKEN = "bench-dashboard-token-000"

_SEED = text("""
    INSERT INTO poller_outbox
        (endpoint_id, bucket, event_type, payload, idempotency_key, status, attempts,
         max_attempts, next_attempt_at, claim_token, delivered_at, failed_at,
         last_status_code, last_error, created_at)
    SELECT e.id, e.bucket, 'order.' || (g % 7), json_build_object('n', g),
           'k' || g, s.status, CASE WHEN s.status = 'pending' THEN 0 ELSE 3 END, 3,
           now() - interval '1 hour', 0,
           CASE WHEN s.status = 'delivered' THEN now() - g * interval '1 millisecond' END,
           CASE WHEN s.status = 'failed' THEN now() - g * interval '1 millisecond' END,
           CASE WHEN s.status = 'failed' THEN 500 + g % 4 END,
           CASE WHEN s.status = 'failed' THEN 'HTTP ' || (500 + g % 4) || ' from receiver' END,
           now() - interval '1 hour'
    FROM generate_series(1, :rows) AS g
    JOIN poller_endpoints e ON e.id = 1 + g % :endpoints
    CROSS JOIN LATERAL (SELECT CASE WHEN g % 50 = 0 THEN 'pending'
                                    WHEN g % 25 < 2 THEN 'failed'
                                    ELSE 'delivered' END AS status) s
""")

_ATTEMPTS = text("""
    INSERT INTO poller_delivery_attempts (message_id, endpoint_id, attempt, kind, poller_id,
                                          outcome, status_code, started_at, finished_at)
    SELECT o.id, o.endpoint_id, 1, 'send', 'bench',
           CASE WHEN o.status = 'failed' THEN 'failed' ELSE 'delivered' END,
           CASE WHEN o.status = 'failed' THEN 503 ELSE 200 END,
           now() - (o.id % :spread) * interval '1 second',
           now() - (o.id % :spread) * interval '1 second'
    FROM poller_outbox o WHERE o.status <> 'pending' AND o.id % 5 = 0
    ORDER BY 8
""")


def seed(url: str, rows: int, endpoint_count: int, spread: int = 3600) -> None:
    engine = sync_engine(url)
    with engine.begin() as conn:
        for i in range(endpoint_count):
            create_endpoint(conn, f"ep-{i:03d}", f"http://127.0.0.1:9/{i}", allow_private=True)
        conn.execute(_SEED, {"rows": rows, "endpoints": endpoint_count})
        conn.execute(_ATTEMPTS, {"spread": spread})
    with engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").execute(text("VACUUM ANALYZE"))
    engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--endpoints", type=int, default=100)
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    with server_url() as admin:
        url = fresh_database(admin, "poller_bench_dashboard")
        began = time.perf_counter()
        seed(url, args.rows, args.endpoints)
        print(
            f"seeded {args.rows:,} messages over {args.endpoints} endpoints "
            f"in {time.perf_counter() - began:.0f} s"
        )
        engine = sync_engine(url)
        app = create_app(load_settings(database_url=url), engine, auth.Credentials(TOKEN))
        with TestClient(app, base_url="http://127.0.0.1:8188", follow_redirects=False) as web:
            web.headers["authorization"] = f"Bearer {TOKEN}"
            page = ""
            for _ in range(100):  # a page 100 pages into the failed list
                found = re.search(r'rel="next" href="([^"]+)"', web.get(page or "/failed").text)
                assert found, "fewer than 100 pages of failures"
                page = found.group(1).replace("&amp;", "&")
            with engine.connect() as conn:
                some = conn.execute(text("SELECT max(id) FROM poller_outbox")).scalar_one()
            pages = [
                ("overview", "/"),
                ("failed, first page", "/failed"),
                ("failed, page 101", page),
                ("failed, one endpoint", "/failed?endpoint=ep-042"),
                ("failed, error search", "/failed?error=from%20receiver"),
                ("failed, status 503", "/failed?error=503"),
                ("message", f"/messages/{some}"),
                ("endpoints", "/endpoints"),
                ("blocked keys", "/keys"),
            ]
            print(f"{'page':<24} {'median':>9} {'worst':>9}")
            for name, path in pages:
                timings = []
                for _ in range(args.runs):
                    start = time.perf_counter()
                    answer = web.get(path)
                    timings.append((time.perf_counter() - start) * 1000)
                    assert answer.status_code == 200, (path, answer.status_code)
                median, worst = statistics.median(timings), max(timings)
                print(f"{name:<24} {median:>6.1f} ms {worst:>6.1f} ms")
        engine.dispose()


if __name__ == "__main__":
    main()
