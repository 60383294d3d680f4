"""Each fault scenario, small, with real processes; the audit must find nothing wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadtest.chaos import SCENARIOS, run_scenario, summary

# `make chaos` runs these, larger: "chaos" (every fault of the others at once, 20,000
# messages), and "kill", "freeze" and "receiver-faults", whose faults "ordered" also
# injects here (kills, a frozen leader, 5xx and dropped answers). Each cost the suite
# 14-23 s of its 6 minutes on two cores.
IN_CHAOS_ONLY = {"chaos", "kill", "freeze", "receiver-faults"}


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", sorted(set(SCENARIOS) - IN_CHAOS_ONLY))
def test_scenario_loses_nothing_and_explains_every_duplicate(name: str, tmp_path: Path) -> None:
    # "ordered": 200 keys x 10 messages, 4 pollers, kills, a freeze, receiver faults.
    messages = {"ordered": 2000}.get(name, 1500)
    rate = 1000 if name == "ordered" else 500
    result = run_scenario(SCENARIOS[name], messages, deadline=120, tmp=tmp_path, rate=rate)
    print("\n" + summary(result))
    assert result["problems"] == []
    assert result["lost"] == 0 and result["duplicate_effects"] == 0
    assert result["messages"] >= messages and result["rolled_back"] > 0
    assert result["wire_duplicates_explained"] == result["wire_duplicates"]
    assert result["order_violations"] == 0 and result["ordered"] > 0
    if name != "receiver-faults" and name != "gone":
        assert result["faults"], "the scenario injected no fault"


def test_the_audit_catches_a_lost_message(engine, endpoint) -> None:  # type: ignore[no-untyped-def]
    """An audit that cannot fail proves nothing: a delivered row the receiver lacks."""
    from sqlalchemy import text
    from sqlalchemy.orm import Session

    from loadtest.chaos import Run, Scenario, audit
    from poller import Message, enqueue_many

    with Session(engine) as session:
        enqueue_many(session, [Message(endpoint.endpoint.name, "t", {}, "a:1")])
        session.commit()
    with engine.begin() as conn:
        conn.execute(text("UPDATE poller_outbox SET status = 'delivered', attempts = 1"))
    run = Run(Scenario("unit"), committed={"a:1"})
    result = audit(engine, run, counts={})
    assert result["lost"] == 1 and "lost" in result["problems"][0]
    result = audit(engine, run, counts={"a:1": 1}, order_violations=2)
    assert result["problems"] == ["2 order violations at the receiver"]


def test_a_key_between_its_heads_completion_and_its_hand_over_is_not_settled(
    engine, endpoint
) -> None:  # type: ignore[no-untyped-def]
    """A completion writes the head's row; its key is handed on a statement later. Between
    the two the key has no pending or in-flight row: a run that called that settled read
    the receiver before the key's last messages were sent (CI saw "lost" messages)."""
    from sqlalchemy import text
    from sqlalchemy.orm import Session

    from loadtest.chaos import Run, Scenario, _settled
    from poller import Message, enqueue_many

    with Session(engine) as session:
        name = endpoint.endpoint.name
        head, _ = enqueue_many(
            session, [Message(name, "t", {}, f"k:{n}", ordering_key="k") for n in (1, 2)]
        )
        session.commit()
    run = Run(Scenario("unit"))
    run.feeding_done.set()
    run.faults_done.set()
    end = text("UPDATE poller_outbox SET status = :status WHERE id = :id")
    with engine.begin() as conn:  # the head's completion, before its hand-over
        conn.execute(end, {"status": "delivered", "id": head})
    assert not _settled(engine, run)
    with engine.begin() as conn:  # a head failed for good blocks its key: that is settled
        conn.execute(end, {"status": "failed", "id": head})
        conn.execute(text("UPDATE poller_ordering_keys SET blocked_since = now()"))
    assert _settled(engine, run)
