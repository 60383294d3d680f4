"""Claim core: batch claims, fenced completions, reclaim, release."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import AsyncEngine

from poller.endpoints.registry import CreatedEndpoint
from poller.rows.claims import Claims
from poller.rules.outcomes import (
    MAX_REFUNDS,
    crashed,
    delivered,
    failed,
    lookup_pending,
    released,
    retry,
    unknown,
)
from poller.store import queries
from tests.conftest import make_endpoint
from tests.integration.helpers import attempts_of, expire_claims, make_due, row, seed


@pytest.fixture(params=[False, True], ids=["one-transaction", "follow-ups-apart"])
async def claims(aengine: AsyncEngine, request: pytest.FixtureRequest) -> AsyncIterator[Claims]:
    """Both ways to complete (Claims.complete): the rows and their follow-ups in one
    transaction, and the service's, a delivery's rows first, alone."""
    claims = Claims(aengine, poller_id="p1", claim_lease=30, follow_ups_apart=request.param)
    yield claims
    await claims.close()


async def test_claim_counts_the_attempt_and_stamps_a_token(
    claims: Claims, engine: Engine, endpoint: CreatedEndpoint
) -> None:
    ids = seed(engine, 5)
    batch = await claims.claim_batch(limit=3)
    assert [m.id for m in batch] == ids[:3]  # oldest due first
    assert {m.attempts for m in batch} == {1}
    assert len({m.claim_token for m in batch}) == 1
    stored = row(engine, ids[0])
    assert (stored.status, stored.claimed_by, stored.attempts) == ("in_flight", "p1", 1)
    assert stored.claim_expires_at > stored.updated_at
    assert len(await claims.claim_batch(limit=10)) == 2
    assert await claims.claim_batch(limit=10) == []


async def test_an_endpoint_of_any_id_is_claimed_from(claims: Claims, engine: Engine) -> None:
    """The claim walks the endpoints with pending messages in id order, around
    through the least bigint: an id given by hand (the identity takes any) is not
    below its start."""
    source = make_endpoint(engine, "source").endpoint
    with engine.begin() as conn:
        for given, name in ((0, "zero"), (-(2**63), "least")):
            conn.execute(
                text(
                    "INSERT INTO poller_endpoints (id, name, url, secret, bucket)"
                    " SELECT :id, :name, url, secret, bucket"
                    " FROM poller_endpoints WHERE id = :source"
                ),
                {"id": given, "name": name, "source": source.id},
            )
    ids = seed(engine, 2, "zero") + seed(engine, 2, "least")
    assert sorted(m.id for m in await claims.claim_batch(limit=10)) == sorted(ids)


async def test_claims_take_the_endpoints_in_turn(claims: Claims, engine: Engine) -> None:
    """Each claim starts after the last endpoint the one before took from, and goes
    around: five endpoints with a backlog each, claims of ten (less than their
    room), and five claims take ten from each; the sixth starts over. A claim walks
    only as far as it needs (over 10,000 endpoints with messages, a claim that
    visited them all took 45 ms where this takes 0.9)."""
    names = [f"turn-{n}" for n in range(5)]
    made = [make_endpoint(engine, name).endpoint for name in names]
    for name in names:
        seed(engine, 30, name)
    taken = []
    for _ in range(6):
        got = await claims.claim_batch(limit=10, default_max_in_flight=64)
        assert len(got) == 10 and len({m.endpoint_id for m in got}) == 1
        taken.append(got[0].endpoint_id)
    in_turn = [e.id for e in sorted(made, key=lambda e: (e.bucket, e.id))]  # the walk's order
    assert taken == [*in_turn, in_turn[0]]


async def test_claim_skips_rows_not_due_and_other_buckets(claims: Claims, engine: Engine) -> None:
    a = make_endpoint(engine, "a").endpoint
    b = make_endpoint(engine, "b").endpoint
    assert a.bucket != b.bucket
    seed(engine, 3, "a")
    seed(engine, 3, "b")
    make_endpoint(engine, "later")
    seed(engine, 3, "later", deliver_after=timedelta(hours=1))
    got = await claims.claim_batch(limit=100, buckets=[b.bucket])
    assert {m.endpoint_id for m in got} == {b.id}
    assert len(await claims.claim_batch(limit=100)) == 3  # "a" only; "later" is not due


async def test_outcomes_apply_and_record_attempts(
    claims: Claims, engine: Engine, endpoint: CreatedEndpoint
) -> None:
    ids = seed(engine, 4)
    m = {msg.id: msg for msg in await claims.claim_batch(limit=4)}
    result = await claims.complete(
        [
            delivered(m[ids[0]], status_code=200, duration_ms=3.5),
            retry(m[ids[1]], 60, status_code=500, error_message="HTTP 500"),
            unknown(m[ids[2]], 5, error_class="ReadTimeout"),
            failed(m[ids[3]], status_code=410, error_message="410 Gone"),
        ]
    )
    assert sorted(result.applied) == ids and result.stale == []
    rows = [row(engine, i) for i in ids]
    states = [(r.status, r.needs_lookup, r.last_status_code) for r in rows]
    assert states == [
        ("delivered", False, 200),
        ("pending", False, 500),
        ("pending", True, None),
        ("failed", False, 410),
    ]
    assert row(engine, ids[0]).delivered_at is not None
    assert row(engine, ids[3]).failed_at is not None
    attempt = attempts_of(engine, ids[2])[0]
    assert (attempt.attempt, attempt.kind, attempt.outcome, attempt.error_class) == (
        1,
        "send",
        "unknown",
        "ReadTimeout",
    )
    assert attempt.stale is False and attempt.poller_id == "p1"


async def test_retry_on_the_last_attempt_fails_the_message(claims: Claims, engine: Engine) -> None:
    make_endpoint(engine, "billing", max_attempts=2)
    (msg_id,) = seed(engine, 1)
    for expected in ("pending", "failed"):
        (msg,) = await claims.claim_batch(limit=1)
        await claims.complete([retry(msg, 0, status_code=503, error_message="HTTP 503")])
        assert row(engine, msg_id).status == expected
    stored = row(engine, msg_id)
    assert (stored.attempts, stored.last_error) == (2, "HTTP 503")
    assert [a.outcome for a in attempts_of(engine, msg_id)] == ["retry", "failed"]


async def test_retry_delay_is_applied_on_the_database_clock(
    claims: Claims, engine: Engine, endpoint: CreatedEndpoint
) -> None:
    (msg_id,) = seed(engine, 1)
    (msg,) = await claims.claim_batch(limit=1)
    await claims.complete([retry(msg, 3600)])
    assert await claims.claim_batch(limit=1) == []  # not due for an hour
    stored = row(engine, msg_id)
    delay = (stored.next_attempt_at - stored.updated_at).total_seconds()
    assert 3599 <= delay <= 3601


async def test_release_hands_back_without_counting_the_attempt(
    claims: Claims, engine: Engine, endpoint: CreatedEndpoint
) -> None:
    (msg_id,) = seed(engine, 1)
    (msg,) = await claims.claim_batch(limit=1)
    await claims.complete([released(msg)])
    stored = row(engine, msg_id)
    assert (stored.status, stored.attempts) == ("pending", 0)
    assert attempts_of(engine, msg_id) == []  # nothing reached the wire
    (again,) = await claims.claim_batch(limit=1)
    assert again.attempts == 1


async def test_lookup_retry_keeps_needs_lookup(
    claims: Claims, engine: Engine, endpoint: CreatedEndpoint
) -> None:
    (msg_id,) = seed(engine, 1)
    (msg,) = await claims.claim_batch(limit=1)
    await claims.complete([unknown(msg, 0)])
    (msg,) = await claims.claim_batch(limit=1)
    assert msg.needs_lookup
    await claims.complete([lookup_pending(msg, 0, status_code=500)])
    assert row(engine, msg_id).needs_lookup is True
    assert [a.kind for a in attempts_of(engine, msg_id)] == ["send", "lookup"]


# --- fencing -------------------------------------------------------------------


async def test_writes_under_a_superseded_claim_change_nothing(
    aengine: AsyncEngine, engine: Engine, endpoint: CreatedEndpoint
) -> None:
    ids = seed(engine, 3)
    first = Claims(aengine, poller_id="p1", claim_lease=30)
    second = Claims(aengine, poller_id="p2", claim_lease=30)
    old = await first.claim_batch(limit=3)
    expire_claims(engine)
    reclaimed = await first.completions.reclaim_expired()
    assert sorted(reclaimed.pending) == ids
    new = await second.claim_batch(limit=3)
    assert {m.claim_token for m in new} != {m.claim_token for m in old}

    for outcome in (delivered, released, failed):
        result = await first.complete([outcome(m) for m in old])
        assert result.applied == [] and sorted(result.stale) == ids
    result = await first.complete([retry(m, 0) for m in old] + [unknown(m, 0) for m in old])
    assert result.applied == []
    assert first.completions.stale_completions == 3 * 5
    assert {row(engine, i).status for i in ids} == {"in_flight"}
    assert {row(engine, i).claimed_by for i in ids} == {"p2"}

    assert sorted((await second.complete([delivered(m) for m in new])).applied) == ids
    assert {row(engine, i).status for i in ids} == {"delivered"}
    stale_rows = [a for a in attempts_of(engine, ids[0]) if a.stale]
    assert len(stale_rows) == 4  # every stale send is on record (released sends nothing)
    assert {a.endpoint_id for a in stale_rows} == {row(engine, ids[0]).endpoint_id}


async def test_a_completed_message_refuses_a_second_completion(
    claims: Claims, engine: Engine, endpoint: CreatedEndpoint
) -> None:
    (msg_id,) = seed(engine, 1)
    (msg,) = await claims.claim_batch(limit=1)
    assert (await claims.complete([delivered(msg)])).applied == [msg_id]
    assert (await claims.complete([failed(msg)])).stale == [msg_id]
    assert row(engine, msg_id).status == "delivered"


# --- reclaim -------------------------------------------------------------------


async def test_expired_claim_becomes_pending_with_lookup(
    claims: Claims, engine: Engine, endpoint: CreatedEndpoint
) -> None:
    (msg_id,) = seed(engine, 1)
    await claims.claim_batch(limit=1)
    assert (await claims.completions.reclaim_expired()).pending == []  # lease still running
    expire_claims(engine)
    assert (await claims.completions.reclaim_expired()).pending == [msg_id]
    stored = row(engine, msg_id)
    assert (stored.status, stored.needs_lookup, stored.attempts) == ("pending", True, 1)
    assert "claim lease expired" in stored.last_error
    assert [a.outcome for a in attempts_of(engine, msg_id)] == ["lease_expired"]


async def test_expired_claim_at_max_attempts_fails_with_a_reason(
    claims: Claims, engine: Engine
) -> None:
    make_endpoint(engine, "billing", max_attempts=1)
    (msg_id,) = seed(engine, 1)
    await claims.claim_batch(limit=1)
    expire_claims(engine)
    assert (await claims.completions.reclaim_expired()).failed == [msg_id]
    stored = row(engine, msg_id)
    assert (stored.status, stored.needs_lookup) == ("failed", False)
    assert stored.failed_at is not None and "did not complete attempt 1" in stored.last_error


async def test_short_lease_expires_on_the_database_clock(
    aengine: AsyncEngine, engine: Engine, endpoint: CreatedEndpoint
) -> None:
    from tests.integration.helpers import wait_for

    seed(engine, 1)
    claims = Claims(aengine, poller_id="p1", claim_lease=0.2)
    await claims.claim_batch(limit=1)
    reclaimed: list[int] = []

    async def swept() -> bool:
        reclaimed.extend((await claims.completions.reclaim_expired()).pending)
        return bool(reclaimed)

    await wait_for(swept, timeout=5)
    make_due(engine)
    (again,) = await claims.claim_batch(limit=1)
    assert again.attempts == 2 and again.needs_lookup


async def test_graceful_refunds_are_bounded_then_the_attempt_counts(
    claims: Claims, engine: Engine
) -> None:
    make_endpoint(engine, "billing", max_attempts=2)
    (msg_id,) = seed(engine, 1)
    for _ in range(MAX_REFUNDS):
        (msg,) = await claims.claim_batch(limit=1)
        await claims.complete([released(msg)])
    assert (row(engine, msg_id).attempts, row(engine, msg_id).refunds) == (0, MAX_REFUNDS)
    (msg,) = await claims.claim_batch(limit=1)
    await claims.complete([released(msg)])  # refunds spent: this attempt counts
    assert (row(engine, msg_id).status, row(engine, msg_id).attempts) == ("pending", 1)
    (msg,) = await claims.claim_batch(limit=1)
    await claims.complete([released(msg, maybe_sent=True)])  # and on the last one: failed
    stored = row(engine, msg_id)
    assert (stored.status, stored.attempts) == ("failed", 2)
    assert "graceful shutdown" in stored.last_error
    assert [a.outcome for a in attempts_of(engine, msg_id)] == ["released"]  # the cut-off send


async def test_a_crash_is_a_counted_recorded_attempt(claims: Claims, engine: Engine) -> None:
    make_endpoint(engine, "billing", max_attempts=2)
    (msg_id,) = seed(engine, 1)
    (msg,) = await claims.claim_batch(limit=1)
    await claims.complete([crashed(msg, 0, maybe_sent=True, error_class="ValueError")])
    stored = row(engine, msg_id)
    assert (stored.status, stored.attempts, stored.needs_lookup) == ("pending", 1, True)
    (msg,) = await claims.claim_batch(limit=1)
    await claims.complete([crashed(msg, 0, maybe_sent=False, error_class="ValueError")])
    assert row(engine, msg_id).status == "failed"
    recorded = [(a.outcome, a.error_class) for a in attempts_of(engine, msg_id)]
    assert recorded == [("crashed", "ValueError"), ("crashed", "ValueError")]


async def test_hostile_text_in_an_outcome_is_stored_not_refused(
    claims: Claims, engine: Engine, endpoint: CreatedEndpoint
) -> None:
    (msg_id,) = seed(engine, 1)
    (msg,) = await claims.claim_batch(limit=1)
    nasty = "nul \x00 lone surrogate \ud800 " + "x" * 10_000
    result = await claims.complete(
        [retry(msg, 0, error_message=nasty, response_excerpt=nasty, error_class="\x00")]
    )
    assert result.applied == [msg_id]
    stored = attempts_of(engine, msg_id)[0]
    assert "\x00" not in stored.error_message and len(stored.response_excerpt) <= 2048


async def test_the_heartbeat_extends_held_claims_and_not_taken_over_ones(
    engine: Engine, aengine: AsyncEngine, endpoint: CreatedEndpoint
) -> None:
    short = Claims(aengine, poller_id="p1", claim_lease=1.0)
    ids = seed(engine, 2)
    held = {m.id: m.claim_token for m in await short.claim_batch(limit=2)}
    first = row(engine, ids[0]).claim_expires_at
    with engine.begin() as conn:  # the second was reclaimed and claimed again elsewhere
        conn.execute(
            text("UPDATE poller_outbox SET claim_token = 999 WHERE id = :i"), {"i": ids[1]}
        )
    kept = await short.extend(held)
    assert (kept.extended, kept.busy) == ({ids[0]}, set())
    assert row(engine, ids[0]).claim_expires_at > first


async def test_an_equal_fence_is_accepted_only_from_its_holder(engine: Engine) -> None:
    offer = '[{"shard": 0, "fence": 5}]'
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO poller_shard_fences (shard) VALUES (0)"))
        accepted = [
            conn.execute(queries.FENCE_SHARDS, {"fences": offer, "holder": who}).all()
            for who in ("a", "a", "b")
        ]
    assert [len(rows) for rows in accepted] == [1, 1, 0]  # b cannot share a's fence


async def test_the_service_claim_reads_its_times_in_utc(
    claims: Claims, engine: Engine, endpoint: CreatedEndpoint
) -> None:
    """The service's claim (its own connection) reads times as datetime.UTC, the cheapest
    to decode and to subtract from (not the server's zone, a ZoneInfo); same instants."""
    seed(engine, 1)
    msg = (await claims.claim(1, endpoint_versions={})).messages[0]
    assert msg.created_at.tzinfo is UTC and msg.endpoint_updated_at.tzinfo is UTC
    assert abs(datetime.now(UTC) - msg.created_at) < timedelta(minutes=1)


async def test_rows_someone_else_holds_neither_stall_the_heartbeat_nor_the_completion(
    claims: Claims, engine: Engine, endpoint: CreatedEndpoint
) -> None:
    """An operator holds `UPDATE poller_outbox … WHERE id = x` open on one of a poller's
    rows. The heartbeat extends the others at once and reports x busy (still ours); the
    completion applies the others at once and carries x; once the lock goes, the next
    completion applies x. (Both used to wait for the operator, every row with them.)"""
    ids = seed(engine, 3)
    batch = await claims.claim_batch(limit=3)
    held = {m.id: m.claim_token for m in batch}
    operator = engine.connect()
    operator.begin()
    operator.execute(
        text("UPDATE poller_outbox SET last_error = 'edited' WHERE id = :i"), {"i": ids[0]}
    )
    try:
        kept = await asyncio.wait_for(claims.extend(held), timeout=5)
        assert (kept.extended, kept.busy) == ({ids[1], ids[2]}, {ids[0]})
        result = await asyncio.wait_for(
            claims.complete([delivered(m, status_code=200) for m in batch]), timeout=5
        )
        assert (sorted(result.applied), result.busy, result.stale) == (ids[1:], [ids[0]], [])
        assert row(engine, ids[0]).status == "in_flight"
    finally:
        operator.commit()
        operator.close()
    result = await claims.complete([])
    assert (result.applied, result.busy, [o.message_id for o in result.ended]) == (
        [ids[0]],
        [],
        [ids[0]],
    )
    assert row(engine, ids[0]).status == "delivered"
    assert [a.outcome for a in attempts_of(engine, ids[0])] == ["delivered"]


async def test_a_held_row_deleted_by_its_holder_ends_the_carried_completion(
    claims: Claims, engine: Engine, endpoint: CreatedEndpoint
) -> None:
    """`DELETE FROM poller_outbox …` held open, then committed: the carried outcome finds
    its row gone, records nothing and is carried no more."""
    (msg_id,) = seed(engine, 1)
    batch = await claims.claim_batch(limit=1)
    with engine.begin() as operator:
        operator.execute(text("DELETE FROM poller_outbox WHERE id = :i"), {"i": msg_id})
        result = await asyncio.wait_for(claims.complete([delivered(batch[0])]), timeout=5)
        assert result.busy == [msg_id]
    result = await claims.complete([])
    assert (result.applied, result.busy, result.stale) == ([], [], [msg_id])
    assert claims.completions.carried == 0
