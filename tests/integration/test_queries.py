"""Every named statement runs against the migrated schema; the hot paths use their indexes."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine, text

from loadtest.fixtures import insert_due, insert_history, insert_waiting
from poller.endpoints.registry import CreatedEndpoint
from poller.rows.claims import ALL_BUCKETS_LITERAL, buckets_literal
from poller.rules.health import HealthPolicy
from poller.rules.outcomes import Outcome, outcomes_json
from poller.store import queries
from poller.store.db import GENERIC_PLAN_SETTINGS, QUEUE_SETTINGS
from tests.conftest import make_endpoint

NOW = datetime.now(UTC)
SETTINGS = {"max_payload_bytes": 262144, "default_max_attempts": 10, "notify": True}
TRACE = {
    "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    "tracestate": "vendor=x",
}
ONE = {
    "endpoint": "billing",
    "event_type": "e",
    "payload": "{}",
    "idempotency_key": "k",
    "ordering_key": None,
    "max_attempts": None,
    "deliver_at": None,
    "deliver_after": None,
    **SETTINGS,
    **TRACE,
}
MANY = {
    "endpoints": ["billing"],
    "event_types": ["e"],
    "payloads": ["{}"],
    "idempotency_keys": ["m"],
    "ordering_keys": ["o"],
    "deliver_ats": [None],
    "deliver_afters": [None],
    "max_attempts": [None],
    **SETTINGS,
    **TRACE,
}
KEYS = {"endpoint_ids": [1], "ordering_keys": ["o"]}
PUBLISH = {
    "event_type": "e",
    "payload": "{}",
    "idempotency_key": "k",
    "tenant": None,
    "deliver_at": None,
    "deliver_after": None,
    **SETTINGS,
    **TRACE,
}
EVENTS = {
    "event_types": ["e", "f"],
    "payloads": ["{}", '{"a": 1}'],
    "idempotency_keys": ["k", "l"],
    "tenants": [None, "acme"],
    "ordering_keys": [None, "o"],
    "deliver_ats": [None, None],
    "deliver_afters": [None, None],
    **SETTINGS,
    **TRACE,
}
ROWS = {
    "endpoint_ids": [1],
    "event_types": ["e"],
    "payloads": ["{}"],
    "idempotency_keys": ["r"],
    "max_attempts": [10],
    "deliver_ats": [None],
    "delays": [0.0],
    "ordering_keys": [None],
    "event_ids": [None],
    "traceparent": None,
    "tracestate": None,
    "notify": True,
}
COMPLETE = {
    **outcomes_json(
        [Outcome(1, 1, 1, "delivered", "delivered", status_code=200, started_at=NOW)], "p"
    ),
    **HealthPolicy().params(),
}

CLAIM = {
    "buckets": ALL_BUCKETS_LITERAL,
    "limit": 10,
    "claimed_by": "p",
    "claim_lease": 30.0,
    "in_flight": '[{"endpoint_id": 1, "n": 3}]',
    "default_max_in_flight": 16,
    "full_tenants": [],
}

SAMPLE_PARAMS: dict[str, dict[str, Any]] = {
    "TRY_ENQUEUE": ONE,
    "ENDPOINTS_BY_NAME": {"names": ["billing"]},
    "ENQUEUE_MANY_CALL": MANY,
    "TRY_PUBLISH": PUBLISH,
    "PUBLISH_MANY_CALL": EVENTS,
    "MARK_CHECKED": {"ids": [1]},
    "UNPUBLISH_CALL": {"event_id": 1},
    "INSERT_ROWS_CALL": ROWS,
    "CLAIM_BATCH": {
        **CLAIM,
        "after_bucket": -1,
        "after": 0,
        "fences": '[{"shard": 0, "fence": 3}]',
        "shards": 8,
    },
    "CLAIM_GOVERNED": {**CLAIM, "gafter_bucket": 0, "gafter": 0, "fences": None, "shards": 8},
    "SPEND_TOKENS": {"spend": '[{"endpoint_id": 1, "tokens": 2.5, "probed": false}]'},
    "HEALTH_REPORT": {"name": None, "after": None, "contains": None, "limit": 50},
    "RESET_HEALTH": {"endpoint_id": 1},
    "ENDPOINTS_BY_ID": {"ids": [1, 2]},
    "EXTEND_CLAIMS": {"ids": [1, 2], "tokens": [5, 6], "claim_lease": 30.0},
    "CLUSTER_FACT": {"key": "shards", "value": "8"},
    "LOCK_TIMEOUT": {"ms": 100},
    "SCHEMA_REVISION": {},
    "ENSURE_SHARD_FENCES": {"shards": 8},
    "SHARD_FENCES": {},
    "FENCE_SHARDS": {"fences": '[{"shard": 0, "fence": 3}]', "holder": "p"},
    "LEASE_ACQUIRE": {"key": "shard:0", "holder": "p", "ttl": 10.0, "floor": 0},
    "LEASE_RENEW": {"key": "shard:0", "holder": "p", "fence": 1, "ttl": 10.0},
    "LEASE_RELEASE": {"key": "shard:0", "holder": "p", "fence": 1},
    "LEASE_HOLDERS": {},
    "MEMBER_HEARTBEAT": {"poller_id": "p", "ttl": 10.0},
    "MEMBER_LEAVE": {"poller_id": "p"},
    "PURGE_DELIVERED": {"age": 3600.0, "limit": 10},
    "PURGE_FAILED": {"age": 3600.0, "limit": 10},
    "PURGE_CANCELLED": {"age": 3600.0, "limit": 10},
    "PURGE_SPENT_KEYS": {"age": 3600.0, "limit": 10},
    "COUNT_BY_STATUS": {},
    "FAILED_BY_REASON": {},
    "COUNT_WITH_KEY": {"key": "k"},
    "ENQUEUED_AFTER": {"after": 0},
    "LAST_MESSAGE_ID": {},
    "GAUGE_ENDPOINTS": {},
    "GAUGE_STATUS": {},
    "COMPLETE_BATCH": COMPLETE,
    "JUDGE_HEALTH": {
        "signals": '[{"endpoint_id": 1, "ok": 0, "bad": 1, "error": "HTTP 500"}]',
        **HealthPolicy().params(),
    },
    "RECLAIM_EXPIRED": {"limit": 10},
    "LOCK_ORDERING_KEYS": KEYS,
    "LOCK_KEYS_OF_HEADS": {"ids": [1]},
    "LOCK_KEYS_OF_MESSAGES": {"ids": [1]},
    "TAKE_KEYS_OF_HEADS": {"ids": [1]},
    "HEADS_AMONG": {"ids": [1]},
    "ENDED_HEADS": {"limit": 10},
    "ADVANCE_KEYS": {"ids": [1], "skipped": [], "notify": True},
    "BLOCKED_KEYS": {"endpoint": None, "limit": 10},
    "REQUEUE_KEYED": {"ids": [1]},
    "SKIP_MESSAGES": {"ids": [1], "who": "ops"},
    "TAKE_KEYS_OF_MESSAGES": {"ids": [1]},
    "CANCEL_MESSAGES": {"ids": [1], "keyed": [1], "who": "ops"},
    "HOLD_ENDPOINT": {"name": "billing", "until": None, "who": "ops"},
    "RELEASE_ENDPOINT": {"name": "billing"},
    "START_REMOVAL": {"endpoint_id": 1},
    "DELETE_UNCLAIMED_MESSAGES": {"endpoint_id": 1},
    "DELETE_EMPTY_ENDPOINT": {"endpoint_id": 1},
    "EVERY_ENDPOINT": {},
    "ENDPOINT_ID": {"name": "billing"},
    "ENDPOINTS_SHOWN": {"names": ["billing", "none"]},
    "CREATE_TOKEN": {
        "name": "t1",
        "scope": "admin",
        "read_only": False,
        "token_sha256": "x",
        "created_by": None,
        "expires_at": None,
    },
    "EVERY_TOKEN": {},
    "REVOKE_TOKEN": {"name": "t1"},
    "TOKEN_BY_DIGEST": {"token_sha256": "x"},
    "TOKEN_USED": {"id": 1},
    "FORGET_REQUESTS": {"kept": 86400.0},
    "TAKE_REQUEST": {"caller": "c", "idempotency_key": "k", "request_sha256": "x", "made": "m"},
    "REQUEST_TAKEN": {"caller": "c", "idempotency_key": "k"},
    "FORGET_LINKS": {"kept": 3600.0},
    "SPEND_LINK": {"nonce": "n", "expires_at": "2030-01-01T00:00:00Z"},
    "EVENT_DELIVERIES": {"event_id": 1},
    "EVENT_ENDPOINT_NAMES": {"ids": [1]},
    "FAILED_MESSAGES": {"ids": [1]},
    "OPEN_COUNTS": {},
    "DELIVERED_COUNTS": {},
    "OUTBOX_ROWS_ESTIMATE": {},
    "ACTIVITY": {"n": 60},
    "THIS_MINUTE": {},
    "REPLAY_BATCH": {
        "endpoint_id": 1,
        "after_at": NOW,
        "after_id": 0,
        "until": NOW,
        "event_type": None,
        "event_id": None,
        "limit": 10,
    },
    "PURGE_EVENTS": {"age": 3600.0, "limit": 10},
    "UNSPEND_KEYS": {"endpoint_id": 1, "keys": ["k"]},
}


def test_every_statement_has_a_sample() -> None:
    assert set(SAMPLE_PARAMS) == set(queries.STATEMENTS)


@pytest.mark.parametrize("name", sorted(SAMPLE_PARAMS))
def test_statement_runs_against_the_schema(
    engine: Engine, endpoint: CreatedEndpoint, name: str
) -> None:
    with engine.begin() as conn:
        result = conn.execute(text(queries.STATEMENTS[name]), SAMPLE_PARAMS[name])
        if result.returns_rows:
            result.all()


def _plan(engine: Engine, name: str, params: dict[str, Any] | None = None) -> str:
    with engine.begin() as conn:
        conn.execute(text("ANALYZE poller_outbox"))
        rows = conn.execute(
            text("EXPLAIN (FORMAT JSON) " + queries.STATEMENTS[name]),
            params or SAMPLE_PARAMS[name],
        ).scalar_one()
    return json.dumps(rows)


def _outbox_scans(plan: str) -> set[str]:
    """How the plan reads poller_outbox: node types, with the index when there is one."""
    found: set[str] = set()

    def walk(node: dict[str, Any]) -> None:
        if node.get("Relation Name") == "poller_outbox":
            found.add(f"{node['Node Type']} {node.get('Index Name', '')}".strip())
        for child in node.get("Plans", []):
            walk(child)

    walk(json.loads(plan)[0]["Plan"])
    return found


@pytest.mark.slow
def test_claim_and_reclaim_use_their_partial_indexes_over_large_history(
    engine: Engine, endpoint: CreatedEndpoint
) -> None:
    """100k delivered rows and 25k ordered rows waiting behind 1,000 heads: the claim
    reads only its due index, and the hand-over to a key's next message its own."""
    ep = endpoint.endpoint
    with engine.begin() as conn:
        insert_history(conn, ep.id, ep.bucket, 100_000)  # loadtest.claims times 1M
        insert_due(conn, ep.id, ep.bucket, 1_000)
        insert_waiting(conn, ep.id, ep.bucket, 25_000, keys=1_000)
        conn.execute(text("ANALYZE poller_ordering_keys"))
        head = conn.execute(text("SELECT min(head_id) FROM poller_ordering_keys")).scalar_one()
    advance = {"ids": [head], "skipped": [], "notify": False}
    for name, index in [
        ("CLAIM_BATCH", "ix_poller_outbox_bucket_due"),
        ("RECLAIM_EXPIRED", "ix_poller_outbox_reclaim"),
        ("ADVANCE_KEYS", "ix_poller_outbox_waiting"),
    ]:
        scans = _outbox_scans(_plan(engine, name, advance if name == "ADVANCE_KEYS" else None))
        assert any(index in scan for scan in scans), (name, scans)
        assert not any(scan.startswith(("Seq Scan", "Bitmap Heap")) for scan in scans), (
            name,
            scans,
        )


def _numbered(name: str) -> tuple[str, list[str]]:
    """A statement's psycopg text with its parameters numbered ($1, $2 …), and their
    names in that order."""
    numbers: dict[str, int] = {}
    sql = re.sub(
        r"%\((\w+)\)s",
        lambda m: f"${numbers.setdefault(m.group(1), len(numbers) + 1)}",
        getattr(queries, name).psycopg,
    ).replace("%%", "%")
    return sql, list(numbers)


def _claim_connection(conn: Any) -> Any:
    """``conn``'s driver connection with the claim connection's settings (poller/store/db.py);
    the caller invalidates ``conn`` after, so they go with it."""
    driver = conn.connection.driver_connection
    for setting in QUEUE_SETTINGS + GENERIC_PLAN_SETTINGS:
        driver.execute(setting)
    return driver


def _generic_plan(engine: Engine, name: str) -> str:
    """The plan the claim connection makes once for its prepared statement, values
    unknown, with that connection's settings (poller/store/db.py autocommit_connection)."""
    sql, _ = _numbered(name)
    with engine.connect() as conn:
        driver = _claim_connection(conn)
        cursor = driver.execute("EXPLAIN (GENERIC_PLAN, FORMAT JSON) " + sql)
        plan = json.dumps(cursor.fetchone()[0])
        conn.invalidate()  # the settings go with the connection
    return plan


@pytest.mark.slow
def test_the_claims_plans_read_the_outbox_by_index_empty_or_backlogged(engine: Engine) -> None:
    """The claim path's statements may be planned once, over an outbox never analyzed
    (a fresh poller: autovacuum analyzes a minute later), analyzed while empty, with
    20,000 due messages of one rate-limited endpoint with a max_age, or analyzed
    after they were deleted (the statistics say no row on pages that are still
    there: every estimate is one row, whatever the table holds): each plan reads
    the outbox through its indexes. Joined to its due rows, the claim's UPDATE read
    the whole outbox of such a backlog to find ten rows (3.3 ms a claim; 1,000,000
    due: 129 ms), and so did the governed claim's aged heads and its test for due
    messages; found by their ids' array, the plan made over an empty outbox read
    every row of the drain after. Over a purged outbox the governed claim's UPDATE,
    joined to its due rows, walked the whole key index; over one analyzed empty, the
    heartbeat and the reclaim walked the whole primary key."""
    ep = make_endpoint(engine, rate_limit=50.0, max_age=3600).endpoint
    states = {  # state: (messages inserted, then statements run)
        "never analyzed": (0, ()),
        "analyzed empty": (0, ("ANALYZE poller_outbox",)),
        "purged": (20_000, ("DELETE FROM poller_outbox", "ANALYZE poller_outbox")),
        "backlogged": (20_000, ("ANALYZE",)),
    }
    for state, (backlog, statements) in states.items():
        with engine.begin() as conn:
            if backlog:
                insert_due(conn, ep.id, ep.bucket, backlog, pad=100)
            for statement in statements:
                conn.execute(text(statement))
        for name in _CLAIM_PATH:
            assert _unkeyed_reads(_generic_plan(engine, name)) == [], (state, name)


# The statements a poller runs while it claims, holds and completes messages.
_CLAIM_PATH = (
    "CLAIM_BATCH",
    "CLAIM_GOVERNED",
    "SPEND_TOKENS",
    "EXTEND_CLAIMS",
    "COMPLETE_BATCH",
    "RECLAIM_EXPIRED",
)


@pytest.mark.slow
def test_a_claim_reads_only_the_endpoints_with_pending_messages(engine: Engine) -> None:
    """Most endpoints of a product's customers have nothing due at a given moment: the
    claim finds the endpoints with pending messages in the outbox's pending index, one
    descent each, the governed claim the governed endpoints by their partial indexes,
    and both read only those endpoints (and health rows). Visiting every enabled
    endpoint, a claim over 10,000 of them took 15-24 ms where it takes 1, and a
    governed claim 21 ms."""
    busy = make_endpoint(engine).endpoint
    with engine.begin() as conn:
        _copy_endpoint(conn, "idle", 3000)
        insert_due(conn, busy.id, busy.bucket, 100)
        conn.execute(text("ANALYZE"))
    for name in ("CLAIM_BATCH", "CLAIM_GOVERNED"):
        plan = _generic_plan(engine, name)
        assert _unkeyed_reads(plan, "poller_endpoints") == [], name
        assert _unkeyed_reads(plan, "poller_endpoint_health") == [], name
        assert _unkeyed_reads(plan) == [], name


@pytest.mark.slow
def test_a_claim_walks_only_as_far_as_it_takes(engine: Engine) -> None:
    """Over 300 endpoints with messages due, a claim of 10 visits a few endpoints,
    not all of them: the walk is read as the claim needs it; the governed claim
    visits the one rate-limited endpoint, and when all 300 are rate limited, a few
    of them, writing only their health rows. Visiting every one, a claim over
    10,000 endpoints with messages took 45 ms where this takes 0.9, a governed claim
    47 ms where this takes 0.3, and 97-102 ms where all were rate limited."""
    source = make_endpoint(engine).endpoint
    with engine.begin() as conn:
        _copy_endpoint(conn, "busy", 299)
        for endpoint_id, bucket in conn.execute(text("SELECT id, bucket FROM poller_endpoints")):
            insert_due(conn, endpoint_id, bucket, 2, prefix=f"{endpoint_id}:")
        conn.execute(
            text("UPDATE poller_endpoints SET rate_limit = 100 WHERE id = :id"), {"id": source.id}
        )
        conn.execute(text("ANALYZE"))
    params = {
        **CLAIM,
        "after_bucket": source.bucket,
        "after": source.id,
        "gafter_bucket": source.bucket,
        "gafter": source.id,
        "fences": None,
        "shards": 1,
    }
    plan = _executed_plan(engine, "CLAIM_BATCH", params)
    walked = _nodes(plan, "Recursive Union")
    assert len(walked) == 1 and walked[0]["Actual Rows"] <= 11, walked[0]["Actual Rows"]
    # A poller that leads one bucket walks its endpoints only (1 or 2 of the 300) and
    # jumps over the others' buckets (walked by endpoint, it read all 300).
    alone = {**params, "buckets": buckets_literal([source.bucket])}
    (walk,) = _nodes(_executed_plan(engine, "CLAIM_BATCH", alone), "Recursive Union")
    assert walk["Actual Rows"] <= 8, walk["Actual Rows"]
    governed = _executed_plan(engine, "CLAIM_GOVERNED", params)
    read = sum(
        node["Actual Rows"] * node["Actual Loops"]
        for node in _nodes(governed, "Index Scan") + _nodes(governed, "Index Only Scan")
        if node.get("Relation Name") == "poller_outbox"
    )
    assert read <= 10, read
    with engine.begin() as conn:  # every one rate limited, each with a token
        conn.execute(text("UPDATE poller_endpoints SET rate_limit = 100"))
    governed = _executed_plan(engine, "CLAIM_GOVERNED", params)
    (walk,) = _nodes(governed, "Recursive Union")
    assert walk["Actual Rows"] <= 11, walk["Actual Rows"]  # the cursor's row, and ten
    with engine.connect() as conn:  # the health rows it spends on (SPEND_TOKENS): those
        spend = conn.execute(queries.CLAIM_GOVERNED, params).first()  # it found
        conn.rollback()
    assert spend is not None and 1 <= len(json.loads(spend.spend)) <= 10, spend
    # ... and a poller that leads one bucket walks that bucket's governed endpoints only,
    # rate limited or with a circuit not closed (walked by id, it read all 300)
    with engine.begin() as conn:
        conn.execute(text("UPDATE poller_endpoint_health SET state = 'open'"))
    for governing in ("UPDATE poller_endpoints SET rate_limit = NULL", "SELECT 1"):
        with engine.begin() as conn:
            conn.execute(text(governing))
        (walk,) = _nodes(_executed_plan(engine, "CLAIM_GOVERNED", alone), "Recursive Union")
        assert walk["Actual Rows"] <= 8, (governing, walk["Actual Rows"])


def _copy_endpoint(conn: Any, prefix: str, count: int) -> None:
    """``count`` copies of the one endpoint there is, named ``prefix-N``, over the buckets."""
    conn.execute(
        text(
            "INSERT INTO poller_endpoints (name, url, secret, bucket)"
            " SELECT :prefix || '-' || g, url, secret, CAST(g % 256 AS smallint)"
            " FROM poller_endpoints, generate_series(1, :count) AS g"
        ),
        {"prefix": prefix, "count": count},
    )


def _executed_plan(engine: Engine, name: str, params: dict[str, Any]) -> dict[str, Any]:
    """The plan of the statement run once as the claim connection runs it (prepared,
    planned once for all values), with its actual row counts."""
    sql, numbers = _numbered(name)
    with engine.connect() as conn:
        driver = _claim_connection(conn)
        driver.execute(f"PREPARE measured AS {sql}")
        values = [params[key] for key in numbers]
        cursor = psycopg.ClientCursor(driver)
        marks = ", ".join(["%s"] * len(values))
        cursor.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE measured({marks})", values)
        plan: dict[str, Any] = cursor.fetchone()[0][0]["Plan"]  # type: ignore[index]
        conn.invalidate()  # the settings go with the connection
    return plan


def _nodes(plan: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    found = [plan] if plan["Node Type"] == kind else []
    for child in plan.get("Plans", []):
        found += _nodes(child, kind)
    return found


# Partial indexes read whole by design: the outbox's in-flight rows (bounded by what
# the pollers hold), the rate-limited endpoints and the circuits not closed (the
# governed ones, bounded by what operators and failures make governed).
_BOUNDED = (
    "ix_poller_outbox_reclaim",
    "ix_poller_endpoints_rate_limited",
    "ix_poller_endpoint_health_not_closed",
)


def _unkeyed_reads(plan: str, table: str = "poller_outbox") -> list[str]:
    """The plan's reads of ``table`` that are not keyed: a sequential or bitmap scan, or
    an index scan with no condition (a whole index, in its order) but of a partial
    index that is bounded otherwise (``_BOUNDED``)."""
    found: list[str] = []

    def walk(node: dict[str, Any]) -> None:
        kind, index = node["Node Type"], node.get("Index Name", "")
        keyed = "Index Cond" in node or index in _BOUNDED
        if (
            node.get("Relation Name") == table
            and kind != "ModifyTable"
            and not (kind in ("Index Scan", "Index Only Scan") and keyed)
        ):
            found.append(f"{kind} {index}".strip())
        for child in node.get("Plans", []):
            walk(child)

    walk(json.loads(plan)[0]["Plan"])
    return found


def test_the_psycopg_text_of_every_statement_takes_the_same_parameters() -> None:
    """The claim path sends a statement's psycopg text to the driver (poller/store/db.py fetch): a
    colon in a literal or a stray % would change the statement silently; this would see it."""

    objects = {s.name: s for s in vars(queries).values() if isinstance(s, queries.Statement)}
    assert objects.keys() == queries.STATEMENTS.keys()  # every one reachable as queries.NAME
    for name, sql in queries.STATEMENTS.items():
        expected = set(text(sql)._bindparams)
        found = set(re.findall(r"%\((\w+)\)s", objects[name].psycopg))
        assert found == expected, name
