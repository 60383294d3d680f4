"""The fault hunt's heavy-handed operator (loadtest/hunt.py): raw SQL on the outbox held
open, and an endpoint removed with its messages in flight.

* **Held edits.** At the planned times the operator opens ``psql`` and runs
  ``BEGIN; UPDATE poller_outbox … WHERE endpoint_id = <the hunt's endpoint> AND status
  = 'in_flight'`` (committed after) or ``DELETE …`` the same rows (rolled back after),
  and leaves it open for up to three claim leases. The pollers' heartbeats and
  completions must go on for every other row: the verdict lets a claim expire only on
  a row that transaction held, between its start and a lease and a sweep after its end
  (loadtest/hunt_check.py ``expired_live_claims``), and every duplicate that causes
  is a recorded lease expiry within the attempt budget (the POST checks).
* **A forced removal.** The endpoint ``doomed`` gets :data:`DOOMED` messages at the
  start, on the same receiver, signed and credentialed as the hunt's endpoint; at the
  planned time the operator removes it with ``force`` (as ``endpoints remove --force``
  and the API's ``DELETE …?force=true`` do) while some are in flight, and does again
  while another transaction keeps it busy. When it returns, the endpoint and every
  message of it are gone, and no POST of its messages reaches the receiver after that
  (one on the wire then ended before its row went: :func:`remove_endpoint`) — but
  from a poller frozen inside the request, which sends it on waking.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

from sqlalchemy import text

from poller import Message, enqueue_many
from poller.endpoints.registry import create_endpoint, remove_endpoint
from poller.errors import EndpointBusy
from poller.store.db import is_transient

if TYPE_CHECKING:
    from loadtest.hostile import HostileReceiver
    from loadtest.hunt import Run

DOOMED = 40  # messages of the endpoint the operator removes
PREFIX = "doomed:"  # their keys
WOKEN = 1.0 + 0.5  # after a freeze ends: the hunt's request timeout, and slack
HELD = {
    "update": "UPDATE poller_outbox SET last_error = last_error WHERE endpoint_id = "
    "(SELECT id FROM poller_endpoints WHERE name = 'hostile') AND status = 'in_flight' "
    "RETURNING id",
    "delete": "DELETE FROM poller_outbox WHERE endpoint_id = "
    "(SELECT id FROM poller_endpoints WHERE name = 'hostile') AND status = 'in_flight' "
    "RETURNING id",
}


def doomed(key: str) -> bool:
    """Whether a message key is one of the removed endpoint's."""
    return key.startswith(PREFIX)


def prepare(conn: Any, url: str, **like_the_hunts: Any) -> None:
    """The endpoint ``doomed``, signed and credentialed as the hunt's (``like_the_hunts``:
    create_endpoint's secret, headers, keyring), with its messages."""
    create_endpoint(conn, "doomed", f"{url}/doomed", allow_private=True, **like_the_hunts)
    enqueue_many(
        conn, [Message("doomed", "hunt.doomed", {"n": n}, f"{PREFIX}{n}") for n in range(DOOMED)]
    )


def heavy(engine: Any, run: Run, stop: threading.Event) -> None:
    """The held edits and the removal, at the planned times."""
    from loadtest.hunt_actors import _wait_until, failure

    steps = [(at, "hold", (seconds, kind)) for at, seconds, kind in run.plan.row_holds]
    if run.plan.doomed_at is not None:
        steps.append((run.plan.doomed_at, "remove", None))
    for at, step, how in sorted(steps, key=lambda s: s[0]):
        if not _wait_until(run.began, at, stop):
            break
        try:
            if step == "hold":
                _hold(engine, run, *how, stop)  # type: ignore[misc]
            else:
                _remove(engine, run, stop)
        except Exception as exc:  # PostgreSQL restarting: the step is lost, not wrong
            failure(run, f"the heavy operator's {step}", exc)
    run.heavy_done.set()


def _hold(engine: Any, run: Run, seconds: float, kind: str, stop: threading.Event) -> None:
    with engine.connect() as conn:
        began = time.time()
        with conn.begin() as tx:
            ids = list(conn.execute(text(HELD[kind])).scalars())
            stop.wait(seconds)
            if kind == "delete":
                tx.rollback()  # an operator's second thoughts: nothing is lost
        run.held_rows.append((ids, began, time.time()))
        run.operated.append(f"held {kind} of {len(ids)} in-flight rows for {seconds:.1f}s")


def _remove(engine: Any, run: Run, stop: threading.Event) -> None:
    """Remove ``doomed`` with its messages; again while it is busy or PostgreSQL away."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            removed = remove_endpoint(engine, "doomed", force=True)
        except EndpointBusy:
            pass
        except Exception as exc:
            if not is_transient(exc):
                raise
        else:
            run.doomed_removed = time.time()
            run.operated.append(f"removed doomed with {removed} messages")
            return
        if stop.wait(0.3):
            return
    run.errors.append("the forced removal of doomed did not finish within 60 s")


def disagrees(engine: Any, run: Run, receiver: HostileReceiver) -> list[str]:
    """The removed endpoint's invariants: gone, every message of it gone, and none of its
    POSTs after the removal returned."""
    if run.plan.doomed_at is None:
        return []
    if run.doomed_removed is None:
        return ["doomed was never removed"]
    with engine.connect() as conn:
        left = conn.execute(text(
            "SELECT (SELECT count(*) FROM poller_endpoints WHERE name = 'doomed') + "
            "(SELECT count(*) FROM poller_outbox WHERE idempotency_key LIKE 'doomed:%')"
        )).scalar_one()  # fmt: skip
    problems = [f"doomed's endpoint or {left} of its rows outlived its removal"] if left else []
    # A poller frozen (SIGSTOP, as a VM pause) with a request of doomed's already begun
    # sends it when it wakes: its claim had expired, so the removal deleted the row, and
    # the late send's outcome is fenced out. No poller can stop a request it was paused
    # inside; it may arrive up to a request timeout after the freeze ends.
    frozen = [(b, e) for kind, _, b, e in run.fault_log if kind == "freeze"]
    removed = run.doomed_removed
    late = sorted(
        f"{key} (+{at - removed:.1f}s)"
        for key, at in receiver.last_arrival.items()
        if doomed(key) and at > removed
        and not any(b < removed and e <= at <= e + WOKEN for b, e in frozen)
    )  # fmt: skip
    if late:
        problems.append(f"{len(late)} of doomed's messages POSTed after its removal: {late[:5]}")
    return problems
