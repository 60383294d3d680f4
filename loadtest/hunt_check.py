"""The fault hunt's verdict: the invariants of loadtest/hunt.py's docstring, checked
from the rows a seed left and what its receiver saw. One line per broken one."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import text

from loadtest.cli_check import cli_disagrees
from loadtest.dashboard_check import dashboard_disagrees
from loadtest.hostile import HostileReceiver
from poller.outcomes import MAX_REFUNDS

if TYPE_CHECKING:
    from loadtest.hunt import Run


def out_of_order(rows: dict[str, Any], receiver: HostileReceiver) -> list[str]:
    """Delivered messages of one ordering key whose first POSTs did not arrive by position
    (message n+1 is sent only after n ended, so n's first POST came first)."""
    wrong = []
    by_key: dict[str, list[Any]] = {}
    for r in rows.values():
        if r.ordering_key is not None and r.status == "delivered":
            by_key.setdefault(r.ordering_key, []).append(r)
    for messages in by_key.values():
        messages.sort(key=lambda r: r.id)  # the id is the position
        arrivals = [receiver.first_arrival.get(r.idempotency_key, -1) for r in messages]
        pairs = zip(messages, messages[1:], arrivals, arrivals[1:], strict=False)
        wrong += [
            f"{later.idempotency_key} before {earlier.idempotency_key}"
            for earlier, later, a, b in pairs
            if b < a
        ]
    return sorted(wrong)


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
                    "ordering_key FROM poller_outbox"
                )
            )
        }
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
        # Fan-out: every published event has exactly the rows it was counted as reaching
        # (one here: the endpoint subscribes to hunt.*), whatever the faults did.
        unfanned = sorted(
            r.idempotency_key
            for r in conn.execute(
                text(
                    "SELECT ev.idempotency_key FROM poller_events ev WHERE ev.fanned_out <> "
                    "(SELECT count(*) FROM poller_outbox o WHERE o.event_id = ev.id) "
                    "OR ev.fanned_out <> 1"
                )
            )
        )
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
    problems = []
    checks: list[tuple[str, list[str]]] = [
        ("committed but missing", sorted(run.committed - set(rows))),
        ("rolled back yet stored", sorted(run.rolled_back & set(rows))),
        (
            "not settled (pending or in flight, or waiting but not behind a blocked head)",
            sorted(
                k
                for k, r in rows.items()
                if r.status not in ("delivered", "failed") and k not in behind_blocked
            ),
        ),
        (
            "delivered out of order (first arrivals of an ordering key not by position)",
            out_of_order(rows, receiver),
        ),
        (
            "over their attempt budget",
            sorted(k for k, r in rows.items() if r.attempts > r.max_attempts),
        ),
        ("refunded too often", sorted(k for k, r in rows.items() if r.refunds > MAX_REFUNDS)),
        (
            "POSTed more often than sends recorded",
            sorted(f"{k} ({n} > {sends[k]})" for k, n in receiver.posts.items() if n > sends[k]),
        ),
        ("POSTed with a bad signature", sorted(receiver.badly_signed)),
        ("published but not fanned out to their subscriber", unfanned),
        ("crashed in the poller", crashed),
        ("with attempts that do not name their endpoint", misnamed),
        (
            "delivered but never applied (lost)",
            sorted(
                k for k, r in rows.items() if r.status == "delivered" and k not in receiver.applied
            ),
        ),
    ]
    for label, found in checks:
        if found:
            problems.append(f"{len(found)} {label}: {found[:5]}")
    problems += run.unexpected_exits + run.errors
    return problems + dashboard_disagrees(engine) + cli_disagrees(engine, db_url, logs)
