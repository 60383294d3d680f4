"""The fault hunt's verdict: the invariants of loadtest/hunt.py's docstring, checked
from the rows a seed left and what its receiver saw. One line per broken one."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import text

from loadtest.cli_check import cli_disagrees
from loadtest.dashboard_check import dashboard_disagrees
from loadtest.forward_proxy import ForwardProxy
from loadtest.hostile import HostileReceiver
from loadtest.hunt_governed import governed
from loadtest.hunt_heavy import doomed
from poller.rules.outcomes import MAX_PROBE_REFUNDS, MAX_REFUNDS

# A row still to end, as the checks count it (``o``: poller_outbox): pending or in
# flight, or waiting on a key that is not blocked behind a failed head. A waiting row
# is open too: between a head's completion and its key's hand-over (a statement after
# it, or the maintenance sweep's) a key has no pending or in-flight row at all, and a
# run that settled then read the receiver before the key's last messages were sent.
UNSETTLED = """(o.status IN ('pending', 'in_flight')  -- delivered, failed, cancelled: ended
       OR (o.status = 'waiting' AND NOT EXISTS (
            SELECT 1 FROM poller_ordering_keys k JOIN poller_outbox h ON h.id = k.head_id
            WHERE k.endpoint_id = o.endpoint_id AND k.ordering_key = o.ordering_key
              AND h.status = 'failed' AND k.blocked_since IS NOT NULL)))"""

if TYPE_CHECKING:
    from loadtest.hunt import Run


CLAIM_LEASE = 3.0  # loadtest/hunt.py's
SETTLE = CLAIM_LEASE + 4.0  # after a fault: the lease runs out, then a sweep reclaims
SUPERVISED = 35.0  # a supervisor's children stop within 30 s of it dying (--processes)
# A failed request as docs/explanation/health.md defines it (no answer, 5xx, 408, 429 —
# to a send or a lookup, a probe or not), in SQL over the attempt rows. Written out here
# rather than taken from poller/rules/health.py: a checker that shares the rule cannot catch
# it drifting.
FAILED_REQUEST = (
    "a.kind IN ('send', 'lookup') AND NOT a.stale AND a.outcome IN "
    "('retry', 'unknown', 'failed', 'probe_failed', 'lookup_retry', 'lookup_failed') "
    "AND (a.status_code IS NULL OR a.status_code >= 500 OR a.status_code IN (408, 429))"
)


def out_of_order(
    rows: dict[str, Any],
    receiver: HostileReceiver,
    resent: Collection[int] = (),
) -> list[str]:
    """Delivered messages of one ordering key whose first POSTs did not arrive by position
    (message n+1 is sent only after n ended, so n's first POST came first). Messages an
    operator sent again (a retry, a replay) come when the operator says, and are left
    out: their positions are checked by :func:`wrong_positions`."""
    wrong = []
    by_key: dict[str, list[Any]] = {}
    for r in rows.values():
        if r.ordering_key is not None and r.status == "delivered" and r.id not in resent:
            by_key.setdefault(r.ordering_key, []).append(r)
    for messages in by_key.values():
        messages.sort(key=lambda r: r.position)
        arrivals = [receiver.first_arrival.get(r.idempotency_key, -1) for r in messages]
        pairs = zip(messages, messages[1:], arrivals, arrivals[1:], strict=False)
        wrong += [
            f"{later.idempotency_key} before {earlier.idempotency_key}"
            for earlier, later, a, b in pairs
            if b < a
        ]
    return sorted(wrong)


def wrong_positions(rows: dict[str, Any], receiver: HostileReceiver) -> list[str]:
    """Ordered messages that arrived with a webhook-ordering-seq other than their position
    (the event's id for a published event, else the message's: poller/rows/ordering.py)."""
    return sorted(
        f"{k} ({sorted(receiver.positions.get(k, set()))} != {r.position})"
        for k, r in rows.items()
        if r.ordering_key is not None
        and k in receiver.posts
        and receiver.positions.get(k, set()) != {r.position}
    )


def expired_live_claims(conn: Any, run: Run) -> list[str]:
    """Claims that expired though their poller was neither killed, frozen nor stopped, and
    PostgreSQL was not restarting: nothing the application, the operator or the receiver
    does may starve a live poller's heartbeat or completion. Only the rows an operator's
    own transaction held (loadtest/hunt_heavy.py) may expire while it held them, or a
    lease and a sweep after."""
    held = [(set(ids), began, ended + SETTLE) for ids, began, ended in run.held_rows]
    windows = []
    for kind, victim, began, ended in run.fault_log:
        slack = SUPERVISED if victim == 0 and run.plan.processes > 1 else 0.0
        if victim is not None:
            windows.append((f"p{victim}", began, ended + SETTLE + slack))
        elif kind == "postgres-restart":
            windows.append((None, began, ended + SETTLE))

    def excused(poller: str, at: float) -> bool:
        for who, began, until in windows:
            mine = (
                who is None
                or poller == who
                or (poller.startswith(who) and not poller[len(who)].isdigit())
            )
            if mine and began <= at <= until:
                return True
        return False

    def held_then(message_id: int, at: float) -> bool:
        return any(message_id in ids and began <= at <= until for ids, began, until in held)

    found = conn.execute(
        text(
            "SELECT o.id, o.idempotency_key, a.poller_id, "
            "extract(epoch FROM a.finished_at) AS at "
            "FROM poller_delivery_attempts a JOIN poller_outbox o ON o.id = a.message_id "
            "WHERE a.outcome = 'lease_expired'"
        )
    )
    return sorted(
        f"{r.idempotency_key} of {r.poller_id}"
        for r in found
        if not excused(r.poller_id or "?", float(r.at)) and not held_then(r.id, float(r.at))
    )


TAKEN_OVER = re.compile(r"claims were taken over before their outcome was written: \[([\d, ]+)\]")


def false_takeovers_in(conn: Any, logs: list[Path]) -> list[str]:
    """Messages a poller's heartbeat reported taken over (``claims_lost``) that no sweep
    ever reclaimed: the heartbeat miscounted (a busy poller once warned of 59–100 a
    round for outcomes it had just written)."""
    reported = {
        int(n)
        for log in logs
        if log.exists()
        for found in TAKEN_OVER.findall(log.read_text("utf-8", "replace"))
        for n in found.split(",")
    }
    if not reported:
        return []
    reclaimed = {
        r.message_id
        for r in conn.execute(
            text(
                "SELECT DISTINCT message_id FROM poller_delivery_attempts "
                "WHERE outcome = 'lease_expired' AND message_id = ANY(:ids)"
            ),
            {"ids": sorted(reported)},
        )
    }
    # a message gone since (an endpoint removed with its messages: an expired claim's row
    # is deleted, not reclaimed) was taken, rightly
    present = {
        r.id
        for r in conn.execute(
            text("SELECT id FROM poller_outbox WHERE id = ANY(:ids)"), {"ids": sorted(reported)}
        )
    }
    return [str(n) for n in sorted((reported - reclaimed) & present)]


def miscounted_failures(conn: Any) -> list[str]:
    """The breaker's count of failed requests (with what still waits in its backlog)
    against the attempt rows that record one: every failed send counts, probes and
    last attempts included."""
    counted = conn.execute(
        text(
            "SELECT coalesce(sum(h.failed_requests), 0) + (SELECT coalesce(sum(bad), 0) "
            "FROM poller_health_backlog) FROM poller_endpoint_health h"
        )
    ).scalar_one()
    recorded = conn.execute(
        text(f"SELECT count(*) FROM poller_delivery_attempts a WHERE {FAILED_REQUEST}")
    ).scalar_one()
    return [] if counted == recorded else [f"breaker counted {counted}, attempts record {recorded}"]


def missed_disables(conn: Any, run: Run) -> list[str]:
    """A failure streak (no delivery, no enable or URL change) that outlasted
    POLLER_DISABLE_AFTER by more than a batch's slack, with the endpoint never disabled
    by the pollers during it."""
    disable_after = run.plan.disable_after
    if not disable_after:
        return []
    # Per completion (one transaction: its finished_at and poller), as the pollers judge:
    # a completion with any delivery resets the streak, whatever else it held.
    batches = conn.execute(
        text(
            "SELECT extract(epoch FROM a.finished_at) AS at, "
            f"bool_or({FAILED_REQUEST}) AS bad, bool_or(a.outcome = 'delivered') AS ok "
            "FROM poller_delivery_attempts a "
            "WHERE a.kind IN ('send', 'lookup') AND NOT a.stale "
            "AND a.endpoint_id IN (SELECT id FROM poller_endpoints "  # as held_sends
            "WHERE name NOT LIKE 'governed-%') "
            "GROUP BY a.finished_at, a.poller_id ORDER BY a.finished_at"
        )
    ).all()
    resets = sorted(run.health_resets)
    disabled = [at for at, reason in run.auto_disabled if reason.startswith("failing since")]
    # A poller frozen inside a completion holds the endpoint's health row until it wakes
    # (or PostgreSQL ends its idle transaction): the others defer their signals to the
    # backlog meanwhile, and the endpoint is judged when the row is free again.
    frozen = [(began, ended) for kind, _, began, ended in run.fault_log if kind == "freeze"]

    def slack(since: float, at: float) -> float:
        return 1.5 + sum(e - b for b, e in frozen if b <= at and e >= since)

    missed, since = [], None
    for row in batches:
        at = float(row.at)
        if row.ok or (since is not None and any(since < r <= at for r in resets)):
            since = None
        if row.ok:
            continue
        if row.bad and since is None:
            since = at
        if row.bad and at - since > disable_after + slack(since, at):
            if not any(since <= d for d in disabled):
                missed.append(f"failing {at - since:.1f}s from {since:.1f}")
            since = None  # one report per streak
    return missed


def unfanned_events(conn: Any, run: Run) -> tuple[list[str], set[str]]:
    """Fan-out: every published event has exactly the one row its subscription gives it
    (the endpoint subscribes to hunt.*), whatever the faults did — or none, when it was
    published while the endpoint was disabled, unless a replay added that row later.
    Returns the events that break this, and the keys of those that rightly reached
    nothing (committed, yet no row)."""
    found = conn.execute(
        text(
            "SELECT ev.idempotency_key, ev.fanned_out, extract(epoch FROM ev.created_at) AS at, "
            "array_agg(o.id) FILTER (WHERE o.id IS NOT NULL) AS rows "
            "FROM poller_events ev LEFT JOIN poller_outbox o ON o.event_id = ev.id "
            "GROUP BY ev.id"
        )
    )

    def disabled_during(began: float, ended: float) -> bool:
        """Whether the endpoint was disabled at some moment of [began, ended]."""
        return any(b - 0.5 <= ended and began <= e + 0.5 for b, e in run.disabled_windows)

    wrong, reached_nothing = [], set()
    for r in found:
        rows = r.rows or []
        if r.fanned_out == 1 and len(rows) == 1:
            continue
        # Published some time between its transaction's start (created_at) and commit:
        # a transaction that waited on a key's lock fans out well after it began.
        committed = run.commit_times.get(r.idempotency_key, float(r.at))
        late = r.fanned_out == 0 and disabled_during(float(r.at), committed)
        if late and not rows:
            reached_nothing.add(r.idempotency_key)  # missed while disabled
            continue
        if late and len(rows) == 1 and rows[0] in run.operator_ids:
            continue  # missed while disabled, added by a replay since
        wrong.append(f"{r.idempotency_key} (reached {r.fanned_out}, {len(rows)} rows)")
    return sorted(wrong), reached_nothing


def held_sends(conn: Any, run: Run) -> list[str]:
    """Sends and lookups that started while the operator's pause held the endpoint: from
    half a second after it committed (a claim just before may still be starting) to its
    end. A freeze overlapping the pause excuses it (a frozen poller's claim wakes late)."""
    frozen = [(b, e) for kind, _, b, e in run.fault_log if kind == "freeze"]
    windows = [
        (paused + 0.5, until - 0.05)
        for paused, until in run.pause_windows
        if not any(b <= until and paused <= e for b, e in frozen)
    ]
    if not windows:
        return []
    found = conn.execute(
        text(
            "SELECT o.idempotency_key, a.kind, extract(epoch FROM a.started_at) AS at "
            "FROM poller_delivery_attempts a JOIN poller_outbox o ON o.id = a.message_id "
            "JOIN poller_endpoints e ON e.id = o.endpoint_id "  # not loadtest/hunt_governed.py's
            "AND e.name NOT LIKE 'governed-%' "
            "WHERE a.kind IN ('send', 'lookup') AND a.started_at IS NOT NULL"
        )
    )
    return sorted(
        f"{r.kind} of {r.idempotency_key} at {float(r.at):.2f}"
        for r in found
        if any(b < float(r.at) < e for b, e in windows)
    )


def proxy_disagrees(
    receiver: HostileReceiver, proxy: ForwardProxy, password: str, logs: list[Path]
) -> list[str]:
    """With a proxy drawn: every request the receiver got came through it (it forwards
    each absolute-form request on a connection of its own), and no poller's log holds
    the proxy's password."""
    problems = []
    arrived = sum(receiver.posts.values()) + receiver.lookups
    if arrived > proxy.forwarded:
        problems.append(
            f"{arrived - proxy.forwarded} requests reached the receiver around the proxy "
            f"({arrived} arrived, {proxy.forwarded} forwarded)"
        )
    leaked = [
        log.name for log in logs if log.exists() and password in log.read_text("utf-8", "replace")
    ]
    if leaked:
        problems.append(f"the proxy's password is in the logs of {leaked}")
    return problems


def check(
    engine: Any, run: Run, receiver: HostileReceiver, db_url: str, logs: list[Path]
) -> list[str]:
    """The invariants of the module docstring; one line per broken one."""
    with engine.connect() as conn:
        rows = {
            r.idempotency_key: r
            for r in conn.execute(
                text(
                    "SELECT id, idempotency_key, status, attempts, max_attempts, refunds, "
                    "probe_refunds, ordering_key, coalesce(event_id, id) AS position "
                    "FROM poller_outbox"
                )
            )
        }
        expired = expired_live_claims(conn, run)
        paused = held_sends(conn, run)
        miscounted = miscounted_failures(conn)
        missed = missed_disables(conn, run)
        sends = Counter(
            {
                r.idempotency_key: r.n
                for r in conn.execute(
                    text(
                        "SELECT o.idempotency_key, count(*) AS n FROM poller_delivery_attempts a "
                        "JOIN poller_outbox o ON o.id = a.message_id WHERE a.kind = 'send' "
                        "GROUP BY 1"
                    )
                )
            }
        )
        unfanned, reached_nothing = unfanned_events(conn, run)
        # A delivery that raised inside the poller (a published row without its event's
        # payload would): counted and recorded, but never expected from any answer.
        crashed = sorted(
            r.idempotency_key
            for r in conn.execute(
                text(
                    "SELECT DISTINCT o.idempotency_key FROM poller_delivery_attempts a "
                    "JOIN poller_outbox o ON o.id = a.message_id WHERE a.outcome = 'crashed'"
                )
            )
        )
        # Every attempt names its message's endpoint (the ratios read it, not the outbox).
        misnamed = sorted(
            r.idempotency_key
            for r in conn.execute(
                text(
                    "SELECT DISTINCT o.idempotency_key FROM poller_delivery_attempts a "
                    "JOIN poller_outbox o ON o.id = a.message_id "
                    "WHERE a.endpoint_id IS DISTINCT FROM o.endpoint_id"
                )
            )
        )
        # A message's bucket is its endpoint's, and so is its health row's: the claims
        # walk each poller's buckets through them.
        misfiled = sorted(
            r.what
            for r in conn.execute(
                text(
                    "SELECT 'message ' || o.idempotency_key AS what FROM poller_outbox o "
                    "JOIN poller_endpoints e ON e.id = o.endpoint_id WHERE o.bucket <> e.bucket "
                    "UNION ALL SELECT 'health row of ' || e.name FROM poller_endpoint_health h "
                    "JOIN poller_endpoints e ON e.id = h.endpoint_id WHERE h.bucket <> e.bucket"
                )
            )
        )
        behind_blocked = {
            r.idempotency_key
            for r in conn.execute(
                text(
                    "SELECT o.idempotency_key FROM poller_outbox o "
                    "JOIN poller_ordering_keys k ON k.endpoint_id = o.endpoint_id "
                    "AND k.ordering_key = o.ordering_key "
                    "JOIN poller_outbox h ON h.id = k.head_id "
                    "WHERE o.status = 'waiting' AND h.status = 'failed' "
                    "AND k.blocked_since IS NOT NULL"
                )
            )
        }
        false_takeovers = false_takeovers_in(conn, logs)
    problems = []
    checks: list[tuple[str, list[str]]] = [
        ("committed but missing", sorted(run.committed - set(rows) - reached_nothing)),
        ("rolled back yet stored", sorted(run.rolled_back & set(rows))),
        (
            "not settled (pending or in flight, or waiting but not behind a blocked head)",
            sorted(
                k
                for k, r in rows.items()
                if r.status not in ("delivered", "failed", "cancelled") and k not in behind_blocked
            ),
        ),
        (
            "cancelled, but not by the operator",
            sorted(
                k
                for k, r in rows.items()
                if r.status == "cancelled" and r.id not in run.cancel_times
            ),
        ),
        (
            "sent or looked up after their cancel",
            sorted(
                k
                for k, r in rows.items()
                if r.status == "cancelled"
                and receiver.last_arrival.get(k, 0.0) > run.cancel_times.get(r.id, 0.0) + 0.05
            ),
        ),
        ("sent or looked up while the operator's pause held", paused),
        (
            "sent in a trace other than the one they were enqueued in",
            sorted(
                f"{k} ({sorted(ids)} != {run.trace_ids.get(k, '')!r})"
                for k, ids in getattr(receiver, "traces", {}).items()
                if k in rows and ids != {run.trace_ids.get(k, "")}
            ),
        ),
        (
            "delivered out of order (first arrivals of an ordering key not by position)",
            out_of_order(rows, receiver, run.operator_ids),
        ),
        ("sent with a position other than their event's", wrong_positions(rows, receiver)),
        ("claims of live pollers expired", expired),
        ("reported taken over by their poller, yet never reclaimed", false_takeovers),
        ("failed requests miscounted by the breaker", miscounted),
        ("failure streaks past POLLER_DISABLE_AFTER without a disable", missed),
        (
            "POSTed more often than their attempts and refunds allow",
            sorted(
                f"{k} ({n} > {rows[k].max_attempts}+{rows[k].refunds}+{rows[k].probe_refunds})"
                for k, n in receiver.posts.items()
                if k in rows and n > rows[k].max_attempts + rows[k].refunds + rows[k].probe_refunds
            ),
        ),
        (
            "over their attempt budget",
            sorted(k for k, r in rows.items() if r.attempts > r.max_attempts),
        ),
        ("refunded too often", sorted(k for k, r in rows.items() if r.refunds > MAX_REFUNDS)),
        (
            "refunded after probes too often",
            sorted(k for k, r in rows.items() if r.probe_refunds > MAX_PROBE_REFUNDS),
        ),
        (
            "POSTed more often than sends recorded",
            sorted(
                f"{k} ({n} > {sends[k]})"
                for k, n in receiver.posts.items()
                if n > sends[k] and not doomed(k)  # removed, with their attempt rows
            ),
        ),
        ("POSTed with a bad signature", sorted(receiver.badly_signed)),
        ("sent without the endpoint's header", sorted(receiver.uncredentialed)),
        ("published but not fanned out to their subscriber", unfanned),
        ("crashed in the poller", crashed),
        ("with attempts that do not name their endpoint", misnamed),
        ("in a bucket other than their endpoint's", misfiled),
        (
            "delivered but never applied (lost)",
            sorted(
                k
                for k, r in rows.items()
                if r.status == "delivered" and k not in receiver.applied and not governed(k)
            ),
        ),
    ]
    for label, found in checks:
        if found:
            problems.append(f"{len(found)} {label}: {found[:5]}")
    problems += run.unexpected_exits + run.errors
    return problems + dashboard_disagrees(engine) + cli_disagrees(engine, db_url, logs)
