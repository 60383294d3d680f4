"""The fault hunt's people: the application and the operator (loadtest/hunt.py).

The hunt's first actors were the receiver and process faults. These two act on
the same database while they run, as people do, through the same functions
the CLI and the dashboard call:

* **the application** writes through a door drawn per seed (:data:`DOORS`: SQLAlchemy,
  psycopg, psycopg2, asyncpg, or the SQL functions called directly), and keeps a
  transaction open after an enqueue or a publish on an ordering key whose head is in
  flight (up to three claim leases), then commits or rolls back; and commits one burst
  of many messages at once;
* **the operator** replays the endpoint's events, retries failed messages,
  skips the failed heads of blocked keys, disables and re-enables the endpoint,
  changes its URL, rotates its secret, cancels open messages (and some in
  flight, which it must refuse) and pauses the endpoint; and, like an operator on call,
  re-enables an endpoint the pollers disabled (``POLLER_DISABLE_AFTER``), noting
  when, so the verdict can check that it was disabled when it should have been.

A third acts on the connections: **the DBA** (or a pooler, or an idle-session
killer) terminates the pollers' backends right after a claim or a completion, for a moment
after each endpoint edit, when every poller's next claim must read the endpoint
again. That lands between a claim that committed (one statement, in autocommit)
and what runs next on its connection: the endpoint read, or CLAIM_BATCH after
CLAIM_GOVERNED. Those messages must be handed back unsent and refunded, never
left in flight until their lease runs out (the verdict's lease invariant does
not excuse these cuts) nor charged an attempt. A completion's rows are written
once (its next statement fails and is written again, fenced), and what follows
from them — a key handed on, a circuit judged — is carried, never lost: every
ordered message still ends, in order.

Each records what it did in the :class:`~loadtest.hunt.Run` (times in
``time.time()``, the database's clock on this machine): the verdict excludes
messages an operator sent again from the order check, and counts the health
resets (enable, URL change) that start a new failure streak.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import psycopg
from sqlalchemy import text
from sqlalchemy.orm import Session

from poller import (
    Event,
    Message,
    enqueue_many,
    enqueue_many_async,
    publish_many,
    publish_many_async,
)
from poller.endpoints.keys import rotate_secret
from poller.endpoints.registry import get_endpoint, set_enabled, update_endpoint
from poller.errors import EndpointDisabled, PollerError
from poller.operate.admin import retry_messages
from poller.operate.cancel import cancel_messages, pause_endpoint
from poller.operate.replay import replay
from poller.outbox.doors import refusal
from poller.rows.ordering import blocked_keys, skip_messages
from poller.rules.health import DEFAULT
from poller.rules.keyring import Keyring
from poller.rules.signing import public_key
from poller.rules.tracing import trace_params
from poller.store.db import is_transient, libpq_url

if TYPE_CHECKING:
    from loadtest.hostile import HostileReceiver
    from loadtest.hunt import Run

ENDPOINT = "hostile"
OPERATOR = "hunt-operator"
BURST = 60  # messages in the application's one big transaction
OPERATOR_ACTIONS = ("replay", "retry", "skip", "disable_enable", "url", "rotate")
HOLDS = ("cancel", "pause")  # drawn apart (Plan.holds), after the rest: seeds keep their plans
LIMIT = 5.0  # requests a second of the rate limit an operator puts on for a while (Plan.limits)
LIMITED = 2.0  # seconds it holds before the endpoint's own limit (or none) is back
CANCELLED_AT_ONCE = 12  # open messages one cancel picks at random, with 3 in flight
PAUSE = 1.5  # seconds an operator's pause holds the endpoint
CUT = 0.6  # seconds the DBA cuts connections after each endpoint edit
# The pollers' backends idle right after a claim (CLAIM_BATCH or CLAIM_GOVERNED: both
# fence, then read what each endpoint holds in flight; pg_stat_activity keeps only a
# statement's first 1,024 bytes): what runs next on that connection fails. An idle
# backend has sent its whole answer, ReadyForQuery included, so a cut loses no claim's rows.
CUT_CLAIMS = text(
    "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
    "WHERE state = 'idle' AND pid <> pg_backend_pid() AND backend_type = 'client backend' "
    "AND query LIKE '%RETURNING f.shard%), busy AS (%'"
)

# And the backends idle right after a completion's statement: COMPLETE_BATCH on the
# connection it has to itself (its next one fails, and is written again, fenced), or
# in the transaction of a completion with failures (rolled back, written again); a
# follow-up (JUDGE_HEALTH, a key's hand-over) in its transaction after rows written
# alone (rolled back, and carried to the next completion).
CUT_COMPLETIONS = text(
    "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
    "WHERE state IN ('idle', 'idle in transaction') AND pid <> pg_backend_pid() "
    "AND backend_type = 'client backend' "
    "AND (query LIKE '%jsonb_array_elements(CAST($1 AS jsonb)) AS r%' "
    "OR query LIKE '%WITH fresh AS (%' OR query LIKE '%JOIN poller_ordering_keys k%')"
)


def failure(run: Run, what: str, exc: Exception) -> None:
    """An actor's step failed. PostgreSQL restarting is part of the hunt; anything else
    fails the seed (such failures were written down and never read: a bug in an API the
    actors use went unseen)."""
    if not (is_transient(exc) or _driver_transient(exc)):
        run.errors.append(f"{what} failed: {exc!r}"[:300])


def _driver_transient(exc: BaseException) -> bool:
    """A connection of the application's other drivers (Plan.door) lost to PostgreSQL
    restarting: psycopg2's and asyncpg's own errors, which poller.store.db does not know."""
    import asyncpg
    import psycopg2

    return isinstance(
        exc,
        psycopg2.OperationalError | psycopg2.InterfaceError | asyncpg.PostgresConnectionError
        | asyncpg.InterfaceError | asyncpg.CannotConnectNowError
        | asyncpg.exceptions.OperatorInterventionError | ConnectionError,
    )  # fmt: skip


def _wait_until(began: float, at: float, stop: threading.Event) -> bool:
    """Sleep until ``at`` seconds after ``began``; False if the hunt stopped first."""
    return not stop.wait(max(0.0, began + at - time.monotonic()))


DOORS = ("sqlalchemy", "psycopg", "psycopg2", "asyncpg", "sql")
"""The application's door, drawn per seed (Plan.door): every door into the outbox keeps
the same promises under faults, as tests/doors holds them to without."""


def write(conn: Any, batch: list[Message], *, publish: bool) -> None:
    """Enqueue ``batch`` in the connection's transaction, or publish it as events (their
    payload then lives in the event, and fan-out gives the endpoint its rows)."""
    if not publish:
        enqueue_many(conn, batch)
        return
    publish_many(conn, _events(batch))


def _events(batch: list[Message]) -> list[Event]:
    return [Event(m.event_type, m.payload, m.idempotency_key, ordering_key=m.ordering_key)
            for m in batch]  # fmt: skip


async def _write_async(conn: Any, batch: list[Message], *, publish: bool) -> None:
    if not publish:
        await enqueue_many_async(conn, batch)
    else:
        await publish_many_async(conn, _events(batch))


# The SQL functions called as an application in another language would, on psycopg:
# the payloads as JSON text, the trace context passed on by hand.
_ENQUEUE_SQL = (
    "SELECT poller_enqueue_many(endpoints => %(e)s, event_types => %(t)s, payloads => %(p)s, "
    "idempotency_keys => %(k)s, ordering_keys => %(o)s, traceparent => %(tp)s, "
    "tracestate => %(ts)s)"
)
_PUBLISH_SQL = (
    "SELECT count(*) FROM poller_publish_many(event_types => %(t)s, payloads => %(p)s, "
    "idempotency_keys => %(k)s, ordering_keys => %(o)s, traceparent => %(tp)s, "
    "tracestate => %(ts)s)"
)


def _write_sql(conn: Any, batch: list[Message], *, publish: bool) -> None:
    params = {
        "e": [m.endpoint for m in batch],
        "t": [m.event_type for m in batch],
        "p": [json.dumps(m.payload) for m in batch],
        "k": [m.idempotency_key for m in batch],
        "o": [m.ordering_key for m in batch],
        **{"tp": None, "ts": None},
    }
    context = trace_params()
    params["tp"], params["ts"] = context["traceparent"], context["tracestate"]
    try:
        conn.execute(_PUBLISH_SQL if publish else _ENQUEUE_SQL, params)
    except Exception as exc:
        if (error := refusal(exc)) is not None:
            raise error from None
        raise


@contextlib.contextmanager
def app_transaction(engine: Any, door: str) -> Iterator[AppTransaction]:
    """One transaction of the application, through ``door``; closed after."""
    url = libpq_url(engine.url.render_as_string(hide_password=False))
    if door == "sqlalchemy":
        with Session(engine) as session:
            yield AppTransaction(session, write, session.commit, session.rollback)
    elif door in ("psycopg", "sql"):
        with psycopg.connect(url) as conn:
            yield AppTransaction(conn, write if door == "psycopg" else _write_sql,
                                 conn.commit, conn.rollback)  # fmt: skip
    elif door == "psycopg2":
        import psycopg2

        conn = psycopg2.connect(url)
        try:
            yield AppTransaction(conn, write, conn.commit, conn.rollback)
        finally:
            conn.close()
    else:
        with _AsyncpgTransaction(url) as tx:
            yield tx


@dataclass
class AppTransaction:
    conn: Any
    _write: Callable[..., None]
    commit: Callable[[], None]
    rollback: Callable[[], None]

    def write(self, batch: list[Message], *, publish: bool) -> None:
        self._write(self.conn, batch, publish=publish)


class _AsyncpgTransaction(AppTransaction):
    """asyncpg from a thread, as a synchronous caller sees it: its own event loop."""

    def __init__(self, url: str) -> None:
        import asyncpg

        self.loop = asyncio.new_event_loop()
        conn = self.loop.run_until_complete(asyncpg.connect(url))
        self.tx = conn.transaction()
        self.loop.run_until_complete(self.tx.start())
        super().__init__(conn, self._write_sync, self._commit, self._rollback)

    def _write_sync(self, conn: Any, batch: list[Message], *, publish: bool) -> None:
        context = contextvars.copy_context()  # the caller's span, for the trace context
        self.loop.run_until_complete(
            self.loop.create_task(_write_async(conn, batch, publish=publish), context=context)
        )

    def _commit(self) -> None:
        self.loop.run_until_complete(self.tx.commit())

    def _rollback(self) -> None:
        self.loop.run_until_complete(self.tx.rollback())

    def __enter__(self) -> _AsyncpgTransaction:
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(Exception):  # PostgreSQL restarting: the connection is gone
            self.loop.run_until_complete(self.conn.close())
        self.loop.close()


def application(engine: Any, run: Run, ordered_keys: int, stop: threading.Event) -> None:
    """Transactions held open on ordering keys, and one burst (plan.lingers, plan.burst_at).

    Each transaction starts at its planned time, whether or not an earlier one is
    still open, as an application's requests do: several may hold keys at once."""
    plan = run.plan
    rng = random.Random(plan.seed * 101 + 7)
    steps = sorted([(at, "linger", hold, commit) for at, hold, commit in plan.lingers]
                   + ([(plan.burst_at, "burst", 0.0, True)] if plan.burst_at else []))  # fmt: skip
    transactions = []
    for n, (at, kind, hold, commit) in enumerate(steps):
        size = BURST if kind == "burst" else rng.randint(1, 3)
        key = f"o{rng.randrange(ordered_keys)}"  # the feeder's keys: their heads are in flight
        batch = [
            Message(ENDPOINT, "hunt.event", {"n": -1, "app": n}, f"app{n}-{i}",
                    ordering_key=key if kind == "linger" or i % 2 == 0 else None)
            for i in range(size)
        ]  # fmt: skip
        publish = rng.random() < 0.5
        transactions.append(
            threading.Thread(
                target=_transaction,
                args=(engine, run, stop, at, kind, hold, commit, batch, publish),
                daemon=True,
            )
        )
    for transaction in transactions:
        transaction.start()
    for transaction in transactions:
        transaction.join()
    run.app_done.set()


def _transaction(
    engine: Any,
    run: Run,
    stop: threading.Event,
    at: float,
    kind: str,
    hold: float,
    commit: bool,
    batch: list[Message],
    publish: bool,
) -> None:
    if not _wait_until(run.began, at, stop):
        return
    keys = {m.idempotency_key for m in batch}
    try:
        with app_transaction(engine, run.plan.door) as tx:
            tx.write(batch, publish=publish)
            stop.wait(hold)  # the application's slow work, its transaction open
            if not commit:
                tx.rollback()
                run.rolled_back |= keys
                return
            tx.commit()
        run.committed_now(keys)
    except EndpointDisabled:  # the pollers disabled it (POLLER_DISABLE_AFTER): refused
        run.app_failures.append(f"{kind}: EndpointDisabled")
    except Exception as exc:  # PostgreSQL restarting: not committed
        run.app_failures.append(f"{kind}: {type(exc).__name__}")
        failure(run, f"the application's {kind}", exc)


def operator(
    engine: Any,
    run: Run,
    receiver: HostileReceiver,
    base_url: str,
    keyring: Keyring,
    stop: threading.Event,
) -> None:
    """The operator's actions at the planned times (plan.operator, plan.holds), then on
    call."""
    limits = [(at, "limit") for at in run.plan.limits]
    for at, action in sorted(run.plan.operator + run.plan.holds + limits):
        if not _wait_until(run.began, at, stop):
            break
        try:
            _act(engine, run, receiver, base_url, keyring, action)
            run.operated.append(action)
        except EndpointDisabled:  # a replay while the endpoint is disabled: refused, rightly
            run.operated.append(f"{action} refused: EndpointDisabled")
        except PollerError as exc:  # no other refusal is expected of these steps
            run.operated.append(f"{action} refused: {type(exc).__name__}")
            run.errors.append(f"the operator's {action} refused: {exc!r}"[:300])
        except Exception as exc:  # PostgreSQL restarting; anything else is the hunt's failure
            run.operated.append(f"{action} failed: {type(exc).__name__}")
            failure(run, f"the operator's {action}", exc)
    run.operator_done.set()
    while not stop.wait(0.3):
        on_call(engine, run)


def on_call(engine: Any, run: Run) -> None:
    """An endpoint the pollers disabled is noted and enabled again (its backlog must drain).

    It was disabled when its row was last written; but the operator is on call only after
    the planned actions, and an edit of the row since (a URL, which also clears the
    health row's failures, a rate limit, the DBA's) moves that moment: the window noted
    starts at the earliest of the row's last write now, the one the watcher saw when it
    first found the endpoint disabled (``run.disabled_seen``), and POLLER_DISABLE_AFTER
    past its failures' start. A publish inside it rightly reached nothing; seed
    490204949's, after a URL change, was reported as lost."""
    try:
        with engine.begin() as conn:
            row = conn.execute(
                text(
                    "SELECT e.enabled, e.disabled_reason, "
                    "extract(epoch FROM e.updated_at) AS since, "
                    "extract(epoch FROM h.failing_since) AS failing "
                    "FROM poller_endpoints e "
                    "LEFT JOIN poller_endpoint_health h ON h.endpoint_id = e.id WHERE e.name = :n"
                ),
                {"n": ENDPOINT},
            ).one()
            if row.enabled:
                return
            since = float(row.since)
            if row.disabled_reason != f"by {OPERATOR}":  # the operator's own re-enable failed
                run.auto_disabled.append((time.time(), row.disabled_reason or ""))
                if row.failing is not None:
                    since = min(since, float(row.failing) + run.plan.disable_after)
                if run.disabled_seen is not None:
                    since = min(since, run.disabled_seen)
            set_enabled(conn, ENDPOINT, True)
            run.health_resets.append(time.time())
            run.disabled_windows.append((since, time.time()))
    except Exception:  # PostgreSQL restarting: the next round looks again
        return


def _act(
    engine: Any,
    run: Run,
    receiver: HostileReceiver,
    base_url: str,
    keyring: Keyring,
    action: str,
) -> None:
    if action == "replay":
        result = replay(engine, ENDPOINT, since=run.began_at, who=OPERATOR)
        run.operator_ids |= set(result.message_ids)
    elif action == "retry":
        with engine.connect() as conn:
            failed = [r.id for r in conn.execute(
                text("SELECT id FROM poller_outbox WHERE status = 'failed' ORDER BY id LIMIT 20")
            )]  # fmt: skip
        run.operator_ids |= set(failed)
        retry_messages(engine, failed, who=OPERATOR)
    elif action == "skip":
        with engine.begin() as conn:
            heads = [k["head_id"] for k in blocked_keys(conn, endpoint=ENDPOINT)]
            run.operator_ids |= set(skip_messages(conn, heads, who=OPERATOR))
    elif action == "disable_enable":
        began = time.time()
        with engine.begin() as conn:
            set_enabled(conn, ENDPOINT, False, reason=f"by {OPERATOR}")
        time.sleep(1.0)
        try:
            with engine.begin() as conn:
                set_enabled(conn, ENDPOINT, True)
        finally:
            run.disabled_windows.append((began, time.time()))
        run.health_resets.append(time.time())
    elif action == "url":
        run.url_changes += 1
        path = "/hook2" if run.url_changes % 2 else "/hook"
        with engine.begin() as conn:
            update_endpoint(conn, ENDPOINT, url=f"{base_url}{path}", allow_private=True)
        run.health_resets.append(time.time())
    elif action == "cancel":  # open ones, and some in flight (refused: their polls decide)
        with engine.connect() as conn:
            ids = [r.id for r in conn.execute(
                text("(SELECT id FROM poller_outbox WHERE status IN ('pending', 'waiting') "
                     "ORDER BY random() LIMIT :n) UNION ALL (SELECT id FROM poller_outbox "
                     "WHERE status = 'in_flight' LIMIT 3)"),
                {"n": CANCELLED_AT_ONCE},
            )]  # fmt: skip
        done = cancel_messages(engine, ids, who=OPERATOR)
        run.cancel_times.update(dict.fromkeys(done.cancelled, time.time()))
    elif action == "pause":  # resumes by itself
        with engine.begin() as conn:
            until = datetime.now(UTC) + timedelta(seconds=PAUSE)
            pause_endpoint(conn, ENDPOINT, until=until, who=OPERATOR)
        run.pause_windows.append((time.time(), until.timestamp()))
    elif action == "limit":  # a rate limit for a while: the endpoint's claims go governed
        with engine.begin() as conn:
            update_endpoint(conn, ENDPOINT, rate_limit=LIMIT, rate_burst=1)
        time.sleep(LIMITED)
        own = run.plan.rate_limit
        with engine.begin() as conn:
            update_endpoint(conn, ENDPOINT, rate_limit=own or DEFAULT, rate_burst=DEFAULT)
    elif action == "rotate":  # to the other scheme: both kinds of signature in the overlap
        with engine.begin() as conn:
            current = get_endpoint(conn, ENDPOINT, keyring=keyring).signing
            other = "ed25519" if current == "hmac-sha256" else "hmac-sha256"
            _, secret = rotate_secret(
                conn, ENDPOINT, timedelta(minutes=10), keyring=keyring, signing=other
            )
        receiver.add_secret(public_key(secret) or secret)  # the old one signs for ten minutes


def dba(engine: Any, run: Run, stop: threading.Event) -> None:
    """At each of ``plan.cuts``, for CUT seconds: an endpoint edit every 50 ms (the same
    ``max_attempts``: nothing changes but ``updated_at``, so every claim is followed by an
    endpoint read), and every poller backend seen idle after a claim is terminated
    (``run.cut_claims`` counts them), and every one seen idle after a completion's
    statement (``run.cut_completions``)."""
    for at in run.plan.cuts:
        if not _wait_until(run.began, at, stop):
            break
        try:
            ends = time.monotonic() + CUT
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                while time.monotonic() < ends and not stop.is_set():
                    update_endpoint(conn, ENDPOINT, max_attempts=run.plan.max_attempts)
                    edited = time.monotonic()
                    while time.monotonic() < edited + 0.05 and not stop.wait(0.001):
                        run.cut_claims += int(conn.execute(CUT_CLAIMS).scalar_one())
                        run.cut_completions += int(conn.execute(CUT_COMPLETIONS).scalar_one())
        except Exception as exc:  # PostgreSQL restarting
            run.operated.append(f"dba failed: {type(exc).__name__}")
            failure(run, "the DBA's cuts", exc)
    run.dba_done.set()
