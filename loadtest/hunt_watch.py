"""What the fault hunt watches while it runs, for invariants no row keeps afterwards.

**A circuit is never stuck half-open.** While an endpoint's circuit is half-open
with none of its messages in flight and one due that a probe may take (not past
the endpoint's ``max_age``, or to be looked up first), the probe it sent has
ended without a verdict (handed back unsent, answered with a 4xx that is not a
failure, older than ``max_age``, reclaimed): the next governed claim must send
the next probe. Messages past ``max_age`` are failed unsent, never probes: while
only those are due, the spell is the second kind's (below). Counted as this kind,
seed 6 failed now and then: a backlog all past ``max_age`` behind the circuit,
its last 30 on one ordering key, each due only once the one before had failed
(one a governed claim), read as "half-open, nothing in flight, a message due"
for 5 s. The
watcher samples every :data:`EVERY` seconds and notes each spell of that state;
the verdict (:func:`stuck_circuits`) reports one longer than :data:`STUCK`
seconds that no fault explains (a poller killed, frozen or stopped, PostgreSQL
or Redis restarting: each until :data:`AFTER_FAULT` seconds after it ended, when
another poller holds the shard and has claimed). Such a circuit waited two claim
leases for its next probe until the governed claim stopped waiting for them.

**An aged-out backlog never waits for a probe or for tokens.** While a circuit
is past its cool-down (or half-open), or its endpoint has a rate limit (and is
not paused), and its endpoint's due messages include ones past ``max_age`` that
need no lookup, the governed claims must take them a claim's worth at a time,
with no probe and no token. The watcher notes those spells too, with how many
of the endpoint's messages were failed as aged (``expiry`` attempts) during
each, and reports one longer than :data:`STUCK` seconds in which they went at
fewer than :data:`AGED_RATE` a second. They went one per governed claim, ten a
second per poller, behind a circuit, and one a token behind a rate limit (the
hunt's is 15/s), before; a claim's worth at a time, a backlog of 500 goes at
100-200 a second here (a claim takes what its free room allows), and lasted
4-6 s: judged by time alone, such a drain read as stuck.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

from sqlalchemy import text

from loadtest.hunt_actors import ENDPOINT, OPERATOR

if TYPE_CHECKING:
    from loadtest.hunt import Run

EVERY = 0.2  # seconds between two samples
# Seconds a circuit may sit half-open with nothing in flight and a message due: a
# governed claim runs at least once a second, and a claim lease is 3 s here (a stuck
# circuit sat two: 6 s).
STUCK = 4.0
# Seconds after a fault ended that it may still hold a circuit's next probe back: the
# election's TTL (1.5 s) hands the shard on, a governed claim follows within a second,
# and a poller reconnecting after PostgreSQL restarted backs off for up to a second.
AFTER_FAULT = 4.0

# The hunt's endpoint disabled by the pollers (POLLER_DISABLE_AFTER, 410 Gone): its row's
# last write (loadtest/hunt_actors.py ``on_call`` notes the window)
DISABLED = text(
    "SELECT extract(epoch FROM updated_at) FROM poller_endpoints "
    "WHERE name = :n AND NOT enabled AND disabled_reason IS DISTINCT FROM :by"
)

HALF_OPEN_IDLE = text(
    "SELECT e.name FROM poller_endpoints e "
    "JOIN poller_endpoint_health h ON h.endpoint_id = e.id "
    "WHERE e.enabled AND h.state = 'half_open' "
    "AND (e.held_by IS NULL OR e.held_until <= now()) "
    "AND NOT EXISTS (SELECT 1 FROM poller_outbox f "
    "                WHERE f.endpoint_id = e.id AND f.status = 'in_flight') "
    "AND EXISTS (SELECT 1 FROM poller_outbox p WHERE p.endpoint_id = e.id "
    "            AND p.status = 'pending' AND p.next_attempt_at <= now() "
    "            AND (e.max_age IS NULL OR p.needs_lookup "
    "                 OR extract(epoch FROM now() - p.created_at) <= e.max_age))"
)


AGED_HEAD = text(
    "SELECT e.name FROM poller_endpoints e "
    "JOIN poller_endpoint_health h ON h.endpoint_id = e.id "
    "WHERE e.enabled AND e.max_age IS NOT NULL "
    "AND (h.state = 'half_open' OR (h.state = 'open' AND h.open_until <= now()) "
    "     OR (h.state = 'closed' AND e.rate_limit IS NOT NULL "
    "         AND (e.paused_until IS NULL OR e.paused_until <= now()))) "
    "AND (e.held_by IS NULL OR e.held_until <= now()) "
    "AND EXISTS (SELECT 1 FROM poller_outbox p WHERE p.endpoint_id = e.id "
    "            AND p.status = 'pending' AND p.next_attempt_at <= now() "
    "            AND NOT p.needs_lookup "
    "            AND extract(epoch FROM now() - p.created_at) > e.max_age)"
)
AGED = "aged: "  # marks an aged-out backlog's spell among run.idle_circuits
# Messages a second that an aged-out backlog must be failed at, at least, for a long
# spell not to count as stuck: twice the faster of the two ways it went wrong.
AGED_RATE = 30.0
EXPIRED = text(
    "SELECT e.name, count(*) FROM poller_delivery_attempts a "
    "JOIN poller_endpoints e ON e.id = a.endpoint_id WHERE a.kind = 'expiry' GROUP BY e.name"
)


def watch_circuits(engine: Any, run: Run, stop: threading.Event) -> None:
    """Note every spell of a half-open circuit with nothing in flight and a message due,
    and of a probe or tokens due behind messages past max_age, as (endpoint, first
    seen, last seen, messages failed as aged meanwhile) in ``run.idle_circuits`` (the
    second kind's names marked :data:`AGED`)."""
    spells: dict[str, tuple[float, int]] = {}  # endpoint -> first seen, expiries then
    expired: dict[str, int] = {}
    while True:  # a sample, then a wait: stopped before it starts, it samples once
        try:
            with engine.connect() as conn:
                disabled = conn.execute(DISABLED, {"n": ENDPOINT, "by": f"by {OPERATOR}"})
                since = disabled.scalar()
                if since is None:
                    run.disabled_seen = None
                elif run.disabled_seen is None:
                    run.disabled_seen = float(since)
                names = {name for (name,) in conn.execute(HALF_OPEN_IDLE)}
                names |= {AGED + name for (name,) in conn.execute(AGED_HEAD)}
                expired = {AGED + name: n for name, n in conn.execute(EXPIRED)}
        except Exception:  # PostgreSQL restarting: a spell is not seen through it
            names = set()
        now = time.time()
        for name, (began, before) in list(spells.items()):
            if name not in names:
                run.idle_circuits.append((name, began, now, expired.get(name, 0) - before))
                del spells[name]
        for name in names:
            spells.setdefault(name, (now, expired.get(name, 0)))
        if stop.wait(EVERY):
            break
    now = time.time()
    run.idle_circuits.extend(
        (name, began, now, expired.get(name, 0) - before)
        for name, (began, before) in spells.items()
    )


def stuck_circuits(run: Run) -> list[str]:
    """The spells longer than :data:`STUCK` seconds that no fault's window explains."""
    windows = [(began, ended + AFTER_FAULT) for _, _, began, ended in run.fault_log]
    t0 = run.began_at.timestamp()  # spells are said in seconds into the run

    def spell(began: float, until: float) -> str:
        return f"for {until - began:.1f}s ({began - t0:.1f}-{until - t0:.1f}s), no fault near"

    def draining(name: str, began: float, until: float, aged: int) -> bool:
        return name.startswith(AGED) and aged >= AGED_RATE * (until - began)

    return [
        f"{name.removeprefix(AGED)} due a probe or tokens behind messages past max_age "
        + spell(began, until)
        + f", {aged} failed as aged meanwhile"
        if name.startswith(AGED)
        else f"circuit of {name} half-open with nothing in flight and a message due "
        + spell(began, until)
        for name, began, until, aged in run.idle_circuits
        if until - began > STUCK
        and not draining(name, began, until, aged)
        and not any(began <= fault_end and start <= until for start, fault_end in windows)
    ]
