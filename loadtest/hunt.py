"""The fault hunt: a seeded random schedule of hostile answers and process faults, then invariants.

    python -m loadtest.hunt [--seeds 20] [--seed N …] [--messages 400] [--deadline 120]

Each seed draws, reproducibly, a whole run: the election backend, the HTTP
client, the attempt budget, a :class:`~loadtest.hostile.HostileReceiver`
answering every request in a randomly chosen bad way, and a schedule of faults
— SIGKILL, SIGSTOP past the leases, SIGTERM (graceful) with restarts of
``poller run`` processes, PostgreSQL restarts (and Redis's, on the redis
backend). A feeder commits messages (some transactions rolled back; one in three
published to the endpoint's subscription rather than enqueued) while the
faults run, and so do the application and the operator (loadtest/hunt_actors.py):

* the application holds transactions open on ordering keys whose head is in
  flight (up to 3 claim leases) and commits or rolls them back, and commits a
  burst;
* the operator replays, retries failed messages, skips blocked heads,
  disables and re-enables the endpoint, changes its URL, rotates its secret
  (to the other signature scheme), cancels open messages, pauses the
  endpoint for 1.5 s and rate-limits it to 5/s for 2 s — through the functions
  the CLI and the dashboard call — and re-enables the endpoint when the
  pollers disabled it; a step of an actor that fails other than while
  PostgreSQL restarts fails the seed;
* a tenant (loadtest/hunt_tenant.py) calls the management API with a
  ``tenant:acme`` token, mostly at the hunt's endpoint, messages and events
  (none of them acme's) on every route that takes a name or an id, and
  publishes ``hunt.strict`` events, whose catalog schema some payloads break;
* a DBA terminates the pollers' backends right after their claims, for a moment
  after each endpoint edit (when every claim is followed by an endpoint read);
* a heavy-handed operator (loadtest/hunt_heavy.py) holds ``UPDATE`` or ``DELETE`` of
  the endpoint's in-flight rows open in ``psql`` for up to three claim leases, and
  force-removes a second endpoint, ``doomed``, while its messages are in flight; the
  tenant also tries its own endpoint's capacity fields and replays an idempotent
  create across a rotation (``overreach``);
* the configuration's extremes are drawn too: ``max_attempts`` 1, the
  endpoint's ``max_in_flight`` 1, the endpoint's own retry schedule (20 ms, or
  0.3 s then 1 s, beside the global 50–400 ms), HMAC or ed25519 signatures, an
  egress proxy,
  ``POLLER_DISABLE_AFTER`` 2 s, the breaker off or after 3 failures with
  cool-downs of 0.2–0.8 s, the endpoint's ``max_age`` 8 or 15 s (messages
  older, probes too, fail unsent), and the shortest claim lease the request
  timeout allows (3 s for 1 s);
* with ``max_age`` 8 s and the breaker on, half the seeds take the receiver
  down for 10 s (503 to everything): the circuit opens, and the backlog ages
  out behind it; half give the endpoint a rate limit of 15/s, so the backlog
  ages out behind the limit too;
* a third of the seeds add 20 rate-limited endpoints with 24 messages each
  (loadtest/hunt_governed.py), every fourth with its messages on two ordering
  keys: none may be sent faster than its limit, across pollers, a key's
  messages go in order, and every message settles.

When all is settled the rows and the receiver must agree (loadtest/hunt_check.py
checks them):

* every committed message is ``delivered``, ``failed`` or ``cancelled``: none
  pending, none in flight, nothing rolled back stored; only the operator
  cancelled, and no POST of a cancelled message arrived after its cancel;
  nothing was sent or looked up while the operator's pause held;
* ``attempts ≤ max_attempts``, ``refunds ≤ MAX_REFUNDS`` and
  ``probe_refunds ≤ MAX_PROBE_REFUNDS`` on every row;
* POSTs that arrived per key ≤ send attempts recorded for its message (every
  send is counted and recorded), and ≤ its attempt budget (operators' retries
  included) plus its refunds;
* no claim of a live poller expires: every ``lease_expired`` attempt names a
  poller that was killed, frozen or stopped, or falls in a PostgreSQL restart,
  each with a lease and a sweep of slack — whatever the application holds open,
  and whatever the DBA cut: a claim whose next statement failed is handed back;
  only the rows the heavy-handed operator's transaction held may expire, while it
  held them or a lease and a sweep after;
* the removed endpoint and all its messages are gone, and none of its POSTs
  arrived after the removal returned (none was sent once its claim had ended);
  and every claim a poller reported taken over (``claims_lost``) was reclaimed;
* no circuit sat half-open with nothing of its endpoint in flight and a message
  due for more than 4 s that no fault explains (loadtest/hunt_watch.py, sampled
  while the hunt runs): a probe that ended with no verdict is followed by the next;
  nor did a circuit due a probe, or an endpoint with a rate limit, wait that
  long behind messages past ``max_age`` (the governed claims take those in a
  claim's worth, with no probe and no token);
* every message and every health row is in its endpoint's bucket (the claims walk
  a poller's buckets through them);
* the breaker counted every failed request: the health rows' ``failed_requests``
  (plus its backlog) equal the attempt rows that record a failed send or lookup;
* with ``POLLER_DISABLE_AFTER`` drawn, no failure streak (no delivery, enable or
  URL change) outlasts it by more than 1.5 s without the pollers disabling the
  endpoint;
* every ``delivered`` message was applied by the receiver (nothing lost);
* half the messages are ordered (16 keys): of the delivered ones, each key's
  first POSTs arrived by position (those an operator sent again aside); every
  ordered POST carried its position (the event's id, or the message's) as
  ``webhook-ordering-seq``; no message is left ``waiting`` unless its key is
  blocked behind a failed head (endpoint ``on_failed_head`` drawn per seed:
  ``block`` or ``skip``);
* every published event (one transaction in three) has exactly one row, at the
  subscribed endpoint, and no delivery crashed in the poller (a published row
  sent without its event's payload would);
* every POST whose body arrived carries a valid signature (the endpoint's
  secret is sealed at rest with ``POLLER_SECRETS_KEY``: the pollers open it);
* every request, POST or lookup, carries the endpoint's ``Authorization``
  header (sealed at rest too), whatever the operator changed meanwhile;
* every attempt row names its message's endpoint;
* the tenant got 404 for everything not acme's, never a 5xx, 403 for every
  capacity field of its own, a replayed create with no secret, and left no trace on
  the hunt's rows (no retry or cancel, no pause or disable naming its token), nor on
  its own endpoint's capacity; no
  payload the catalog refuses was kept or sent, through ``publish()`` or the API;
* with a proxy drawn (``POLLER_PROXY_URL``, one seed in two), every request the
  receiver got came through it, and no poller's log holds its password;
* half the feeder's transactions run inside an application's span: every request
  of their messages carries that trace (``traceparent``), every other request none;
  with tracing drawn (one seed in two) the pollers export spans to a sink, and some
  arrive;
* the dashboard, over the final database: every page and the first failed
  messages' pages answer 200 with no unescaped markup, and the overview's
  counts are the database's (loadtest/dashboard_check.py);
* the operator CLI, over the final database: ``admin failed``, ``admin show``,
  ``endpoints health`` and ``admin stats`` answer, and neither they nor any
  poller's log hold a character a terminal would act on, whatever the receiver
  answered (loadtest/cli_check.py);
* no ``poller run`` exited unless the hunt ended it, and every graceful stop
  exited 0 (G11: a crash would exit 70);
* with ``processes`` 2 drawn, poller p0 is ``poller run --processes 2`` (a
  supervisor and two children, faults hitting the supervisor): the children of
  a killed supervisor stop by themselves within 30 s.

A failing seed prints itself and the command that replays it. ``make test``
runs a small budget (tests/faults/test_hunt.py); ``make chaos`` a long one.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import random
import shutil
import signal
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import INVALID_SPAN, NonRecordingSpan, SpanContext, TraceFlags
from sqlalchemy import text

from loadtest import hunt_governed, hunt_heavy, hunt_tenant
from loadtest.forward_proxy import ThreadedProxy
from loadtest.hostile import HostileReceiver
from loadtest.hunt_actors import (
    DOORS,
    HOLDS,
    OPERATOR_ACTIONS,
    app_transaction,
    application,
    dba,
    operator,
)
from loadtest.hunt_check import UNSETTLED, check, proxy_disagrees
from loadtest.hunt_watch import stuck_circuits, watch_circuits
from loadtest.otlp_sink import Sink
from loadtest.procs import Proc, clean_env, guarded
from poller import Message
from poller.endpoints.registry import create_endpoint, new_secret
from poller.local.embedded import EmbeddedPostgres, EmbeddedRedis
from poller.rules.keyring import Keyring, new_key
from poller.rules.signing import public_key
from poller.service.server_watch import stop_at_exit
from poller.store import migrate
from poller.store.db import sync_engine

TTL = 1.5
CLAIM_LEASE = 3.0
# A graceful stop exits 0; a SIGTERM that lands while Python is still importing (before
# the handler exists) ends the process by the default action: nothing claimed yet.
STOPPED = (0, -signal.SIGTERM)
ORDERED_KEYS = 16


@dataclass
class Plan:
    """Everything one seed decides."""

    seed: int
    election: str
    http_client: str
    pollers: int
    max_attempts: int
    faults: list[tuple[float, str]]  # (seconds after the start, fault)
    lookup: bool
    on_failed_head: str = "block"  # what the endpoint's ordering keys do on a failed head
    circuit_failures: int = 10  # failed sends in a row that open the circuit (0: never)
    processes: int = 1  # p0's `poller run --processes` (2: a supervisor and two children)
    # The application (loadtest/hunt_actors.py): transactions held open on ordering keys
    # (seconds after the start, seconds held, committed or rolled back), one burst.
    lingers: list[tuple[float, float, bool]] = field(default_factory=list)
    burst_at: float | None = None
    operator: list[tuple[float, str]] = field(default_factory=list)  # (seconds, action)
    max_in_flight: int | None = None  # the endpoint's; 1 is the extreme
    disable_after: float = 0.0  # POLLER_DISABLE_AFTER (0: never)
    retry_schedule: list[float] | None = None  # the endpoint's own (None: the global one)
    signing: str = "hmac-sha256"  # or ed25519: the receiver verifies with the public key
    holds: list[tuple[float, str]] = field(default_factory=list)  # (seconds, cancel|pause)
    proxy: bool = False  # every request through an egress proxy (POLLER_PROXY_URL)
    tracing: bool = False  # the pollers export spans over OTLP (to a sink in the hunt)
    # A tenant through the management API, and strict publishes (loadtest/hunt_tenant.py):
    # (seconds after the start, "calls" or "strict").
    tenant: list[tuple[float, str]] = field(default_factory=list)
    # The DBA (loadtest/hunt_actors.py): seconds after the start of each window of cuts.
    cuts: list[float] = field(default_factory=list)
    # The endpoint's max_age (seconds): messages older are failed unsent, probes included.
    max_age: float | None = None
    # (seconds after the start, seconds): the receiver answers 503 to all, longer than
    # max_age, so a backlog ages out behind the open circuit (loadtest/hunt_watch.py).
    outage: tuple[float, float] | None = None
    # The endpoint's rate limit (requests per second): with max_age 8 s, a backlog ages
    # out behind it, and what is past max_age must take no token (loadtest/hunt_watch.py).
    rate_limit: float | None = None
    # When the operator puts a rate limit of 5/s on the endpoint for 2 s (its ordered
    # keys' next messages then come due with no NOTIFY, for the governed claim alone)
    limits: list[float] = field(default_factory=list)
    # The heavy-handed operator (loadtest/hunt_heavy.py): raw edits of the endpoint's
    # in-flight rows held open (seconds after the start, seconds held, update|delete),
    # and when it removes the endpoint "doomed" with its messages (None: it has none).
    row_holds: list[tuple[float, float, str]] = field(default_factory=list)
    doomed_at: float | None = None
    # The application's door (loadtest/hunt_actors.py DOORS): the feeder's and the
    # application's transactions go through it.
    door: str = "sqlalchemy"

    @classmethod
    def draw(cls, seed: int, duration: float) -> Plan:
        rng = random.Random(seed)
        kinds = ["kill", "kill", "freeze", "term", "postgres-restart"]
        election = rng.choice(["redis", "postgres"])
        if election == "redis":
            kinds.append("redis-restart")
        count = rng.randint(2, 5)
        faults = sorted((rng.uniform(1.0, duration), rng.choice(kinds)) for _ in range(count))
        plan = cls(
            seed=seed,
            election=election,
            http_client=rng.choice(["aiohttp", "httpx", "reqwest"]),
            pollers=rng.randint(2, 3),
            max_attempts=rng.randint(2, 5),
            faults=faults,
            lookup=rng.random() < 0.8,
            on_failed_head=rng.choice(["block", "skip"]),  # drawn late: earlier draws unchanged
            circuit_failures=rng.choice([0, 3, 10]),
            processes=rng.choice([1, 2]),
        )
        # Drawn after the rest, so earlier seeds keep their receiver and faults: the
        # application, the operator and the configuration's extremes.
        plan.lingers = [
            (rng.uniform(0.5, duration), rng.uniform(0.5, 3 * CLAIM_LEASE), rng.random() < 0.7)
            for _ in range(rng.randint(1, 3))
        ]
        plan.burst_at = rng.uniform(0.5, duration) if rng.random() < 0.5 else None
        plan.operator = sorted(
            (rng.uniform(1.0, duration + 2), rng.choice(OPERATOR_ACTIONS))
            for _ in range(rng.randint(1, 4))
        )
        plan.max_in_flight = rng.choice([None, None, 1])
        plan.disable_after = rng.choice([0.0, 0.0, 2.0])
        if rng.random() < 0.25:
            plan.max_attempts = 1
        plan.retry_schedule = rng.choice([None, None, [0.02], [0.3, 1.0]])
        plan.signing = rng.choice(["hmac-sha256", "ed25519"])
        plan.holds = sorted(
            (rng.uniform(1.0, duration + 2), rng.choice(HOLDS)) for _ in range(rng.randint(0, 3))
        )
        plan.proxy = rng.random() < 0.5
        plan.tracing = rng.random() < 0.5
        plan.tenant = sorted(
            (rng.uniform(0.5, duration), rng.choice(["calls", "calls", "strict"]))
            for _ in range(rng.randint(1, 4))
        )
        plan.cuts = sorted(rng.uniform(1.0, duration) for _ in range(rng.randint(0, 2)))
        plan.max_age = rng.choice([None, None, None, 8.0, 15.0])
        down, at = rng.random() < 0.5, rng.uniform(1.0, 3.0)
        if down and plan.max_age == 8.0 and plan.circuit_failures:  # 15 s: too long a wait
            plan.outage = (at, plan.max_age + 2.0)
        if plan.max_age == 8.0 and rng.random() < 0.5:
            plan.rate_limit = 15.0  # 250 messages: over 16 s of tokens, twice max_age
        if rng.random() < 1 / 3:  # drawn last: every other draw stays as it was
            plan.limits = sorted(rng.uniform(1.0, duration) for _ in range(rng.randint(1, 2)))
        # After the rest too: the tenant's overreach, the heavy-handed operator.
        plan.tenant = sorted(
            plan.tenant
            + [(rng.uniform(0.5, duration), "overreach") for _ in range(rng.randint(0, 2))]
        )
        plan.row_holds = sorted(
            (rng.uniform(1.0, duration), rng.uniform(0.5, 3 * CLAIM_LEASE),
             rng.choice(["update", "delete"]))
            for _ in range(rng.choice([0, 0, 1, 2]))
        )  # fmt: skip
        plan.doomed_at = rng.uniform(0.5, duration) if rng.random() < 0.5 else None
        plan.door = rng.choice(DOORS)  # drawn last: every other draw stays as it was
        return plan

    def describe(self) -> str:
        faults = ", ".join(f"{kind}@{at:.1f}s" for at, kind in self.faults)
        return (
            f"seed {self.seed}: {self.pollers} pollers, election {self.election}, "
            f"{self.http_client}, max_attempts {self.max_attempts}, "
            f"lookup {'on' if self.lookup else 'off'}, {self.on_failed_head} on a failed head, "
            f"circuit after {self.circuit_failures or 'never'}, "
            f"p0 with {self.processes} process(es), faults: {faults}; "
            f"max_in_flight {self.max_in_flight or 'default'}, "
            f"disable_after {self.disable_after or 'never'}, "
            f"retry schedule {self.retry_schedule or 'global'}, {self.signing}"
            f"{', through a proxy' if self.proxy else ''}"
            f"{', exporting spans' if self.tracing else ''}; application through {self.door}: "
            + ", ".join(
                f"{'commit' if c else 'rollback'} after {h:.1f}s@{at:.1f}s"
                for at, h, c in self.lingers
            )
            + (f", burst@{self.burst_at:.1f}s" if self.burst_at else "")
            + "; operator: "
            + ", ".join(
                f"{action}@{at:.1f}s"
                for at, action in sorted(
                    self.operator + self.holds + [(at, "limit") for at in self.limits]
                )
            )
            + "; tenant: "
            + ", ".join(f"{kind}@{at:.1f}s" for at, kind in self.tenant)
            + "; dba: "
            + (", ".join(f"cuts@{at:.1f}s" for at in self.cuts) or "none")
            + (f"; max_age {self.max_age:g}s" if self.max_age else "")
            + (f"; receiver down {self.outage[1]:g}s@{self.outage[0]:.1f}s" if self.outage else "")
            + (f"; rate limit {self.rate_limit:g}/s" if self.rate_limit else "")
            + "; heavy operator: "
            + (
                ", ".join(
                    [f"{kind} held {held:.1f}s@{at:.1f}s" for at, held, kind in self.row_holds]
                    + ([f"remove doomed@{self.doomed_at:.1f}s"] if self.doomed_at else [])
                )
                or "none"
            )
        )


@dataclass
class Run:
    plan: Plan
    began: float = field(default_factory=time.monotonic)
    began_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    committed: set[str] = field(default_factory=set)
    commit_times: dict[str, float] = field(default_factory=dict)  # key -> time.time() of commit
    rolled_back: set[str] = field(default_factory=set)
    injected: list[str] = field(default_factory=list)
    unexpected_exits: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    feeding_done: threading.Event = field(default_factory=threading.Event)
    faults_done: threading.Event = field(default_factory=threading.Event)
    app_done: threading.Event = field(default_factory=threading.Event)
    operator_done: threading.Event = field(default_factory=threading.Event)
    # (fault, poller index or None, time.time() it began, and ended) for the verdict
    fault_log: list[tuple[str, int | None, float, float]] = field(default_factory=list)
    # (endpoint, from, until, messages failed as aged meanwhile): spells of a half-open
    # circuit with nothing in flight and a message due, or of a probe or tokens due
    # behind aged-out messages (hunt_watch.py)
    idle_circuits: list[tuple[str, float, float, int]] = field(default_factory=list)
    app_failures: list[str] = field(default_factory=list)
    operated: list[str] = field(default_factory=list)
    operator_ids: set[int] = field(default_factory=set)  # messages an operator sent again
    health_resets: list[float] = field(default_factory=list)  # enables and URL changes
    auto_disabled: list[tuple[float, str]] = field(default_factory=list)
    disabled_windows: list[tuple[float, float]] = field(default_factory=list)  # (from, to)
    # The endpoint's row's last write when the watcher first saw the pollers had disabled
    # it (loadtest/hunt_watch.py), until it is seen enabled: where its disabled window
    # begins, whatever edits of the row follow before the operator is on call
    disabled_seen: float | None = None
    url_changes: int = 0
    cancel_times: dict[int, float] = field(default_factory=dict)  # id -> last cancel's commit
    trace_ids: dict[str, str] = field(default_factory=dict)  # key -> the span it was fed in
    pause_windows: list[tuple[float, float]] = field(default_factory=list)  # (paused, until)
    tenant_done: threading.Event = field(default_factory=threading.Event)
    tenant_log: list[str] = field(default_factory=list)  # each API call and its answer
    tenant_wrong: list[str] = field(default_factory=list)  # answers the tenant must not get
    strict_refused: set[str] = field(default_factory=set)  # keys of payloads the catalog refuses
    dba_done: threading.Event = field(default_factory=threading.Event)
    heavy_done: threading.Event = field(default_factory=threading.Event)
    # (ids, time.time() began, ended) of each raw edit held open (loadtest/hunt_heavy.py)
    held_rows: list[tuple[list[int], float, float]] = field(default_factory=list)
    doomed_removed: float | None = None  # when the forced removal of "doomed" returned
    cut_claims: int = 0  # poller backends the DBA terminated right after a claim
    cut_completions: int = 0  # ... and right after a completion's statement

    def committed_now(self, keys: set[str]) -> None:
        self.committed |= keys
        self.commit_times.update(dict.fromkeys(keys, time.time()))


class Fleet:
    """The ``poller run`` processes; knows which exits the hunt caused."""

    def __init__(self, env: dict[str, str], count: int, tmp: Path, run: Run) -> None:
        self.run = run
        many = ["--processes", str(run.plan.processes)]
        self.procs = [
            Proc(["run", "--id", f"p{n}", *(many if n == 0 else [])], env, tmp / f"p{n}.log")
            for n in range(count)
        ]
        self.expected: set[int] = set()  # indexes whose current exit we caused
        self.orphans: list[int] = []  # children of killed supervisors: must stop themselves
        self.lock = threading.Lock()

    def check(self) -> None:
        """Record any poller that exited without being told to."""
        with self.lock:
            for i, proc in enumerate(self.procs):
                code = proc.popen.poll()
                if code is not None and i not in self.expected:
                    tail = proc.output()[-1500:]
                    self.run.unexpected_exits.append(f"p{i} exited {code}: …{tail}")
                    self.expected.add(i)  # report once

    def kill(self, i: int) -> None:
        with self.lock:
            self.expected.add(i)
        self.orphans += _children_of(self.procs[i].popen.pid)
        self.procs[i].kill()
        self._restart(i)

    def term(self, i: int) -> None:
        with self.lock:
            self.expected.add(i)
        proc = self.procs[i]
        proc.signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
        if code not in STOPPED:
            self.run.unexpected_exits.append(f"p{i} exited {code} after SIGTERM")
        self._restart(i)

    def freeze(self, i: int) -> None:
        proc = self.procs[i]
        proc.signal(signal.SIGSTOP)
        time.sleep(max(TTL, CLAIM_LEASE) + 1.5)  # past its leases and its claims
        proc.signal(signal.SIGCONT)

    def _restart(self, i: int) -> None:
        with self.lock:
            self.procs[i].restart()
            self.expected.discard(i)

    def stop_all(self) -> None:
        for i, proc in enumerate(self.procs):
            with self.lock:
                self.expected.add(i)
            if proc.popen.poll() is None:
                proc.signal(signal.SIGTERM)
        for i, proc in enumerate(self.procs):
            try:
                code = proc.wait(timeout=60)
            except Exception:
                proc.stop(timeout=5, graceful=False)
                code = -9
            if code not in STOPPED:
                self.run.unexpected_exits.append(f"p{i} exited {code} at the end (SIGTERM)")
            proc.handle.close()
        deadline = time.monotonic() + 30
        while (alive := [p for p in self.orphans if _alive(p)]) and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid in alive:  # ours to end: the supervisor we killed started them
            self.run.unexpected_exits.append(f"child {pid} outlived its killed supervisor")
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _children_of(pid: int) -> list[int]:
    """The live child processes of ``pid`` (a `--processes` supervisor's pollers)."""
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def _span(tx: int) -> NonRecordingSpan:
    """The application's span for transaction ``tx``: its own trace id, sampled."""
    trace_id = (0x5EED << 100) | tx
    return NonRecordingSpan(SpanContext(trace_id, tx | 1, False, TraceFlags(1)))


def _feed(engine: Any, run: Run, messages: int) -> None:
    n = tx = 0
    while len(run.committed) < messages:
        tx += 1
        size = random.Random(run.plan.seed * 7919 + tx).randint(1, 20)
        batch = [  # every other message is ordered, on one of ORDERED_KEYS keys
            Message(
                "hostile",
                "hunt.event",
                {"n": n + i},
                f"k{n + i}",
                ordering_key=f"o{(n + i) // 2 % ORDERED_KEYS}" if (n + i) % 2 == 0 else None,
            )
            for i in range(size)
        ]
        n += size
        keys = {m.idempotency_key for m in batch}
        span = _span(tx) if tx % 2 == 0 else None  # half inside an application's span
        try:
            with (
                app_transaction(engine, run.plan.door) as transaction,
                trace.use_span(span or INVALID_SPAN),
            ):
                transaction.write(batch, publish=tx % 3 == 0)  # one in three published
                if tx % 7 == 0:
                    transaction.rollback()
                    run.rolled_back |= keys
                    continue
                transaction.commit()
            run.committed_now(keys)
            if span is not None:
                trace_id = f"{span.get_span_context().trace_id:032x}"
                run.trace_ids.update(dict.fromkeys(keys, trace_id))
        except Exception:  # PostgreSQL restarting: this transaction did not commit
            time.sleep(0.2)
        time.sleep(0.01)
    run.feeding_done.set()


def _inject(
    run: Run, fleet: Fleet, pg: EmbeddedPostgres, redis: EmbeddedRedis | None, stop: threading.Event
) -> None:
    rng = random.Random(run.plan.seed * 31 + 1)
    began = time.monotonic()
    for at, kind in run.plan.faults:
        while time.monotonic() - began < at:
            if stop.wait(0.1):
                return
            fleet.check()
        victim = rng.randrange(len(fleet.procs))
        started = time.time()
        if kind == "kill":
            fleet.kill(victim)
        elif kind == "term":
            fleet.term(victim)
        elif kind == "freeze":
            fleet.freeze(victim)
        elif kind == "postgres-restart":
            pg.restart()
        elif kind == "redis-restart" and redis is not None:
            redis.stop()
            time.sleep(0.5)
            redis.start()
        run.injected.append(kind)
        on_poller = kind in ("kill", "term", "freeze")
        run.fault_log.append((kind, victim if on_poller else None, started, time.time()))
    run.faults_done.set()
    while not stop.wait(0.2):
        fleet.check()


# Rows still to end, as the checker counts them (UNSETTLED). A key a completion could
# not hand on (the application held it, then its poller was killed) is handed on by the
# maintenance sweep seconds later; settling before that flagged its messages as "not
# settled" (a fresh seed of `make test`, 1325690558, did).
OPEN_ROWS = text(f"SELECT count(*) FROM poller_outbox o WHERE {UNSETTLED}")


def _open_rows(engine: Any) -> int:
    try:
        with engine.connect() as conn:
            return int(conn.execute(OPEN_ROWS).scalar_one())
    except Exception:  # PostgreSQL restarting
        return -1


class Egress:
    """What a seed's requests go through and report to: an egress proxy (``plan.proxy``)
    and an OTLP sink for the pollers' spans (``plan.tracing``)."""

    def __init__(self, plan: Plan) -> None:
        self.password = f"hunt-{new_key()[:12]}"  # must reach no log or output
        self.proxy = ThreadedProxy(credentials=("hunt", self.password)) if plan.proxy else None
        self.sink = Sink() if plan.tracing else None

    def start(self) -> dict[str, str]:
        """The pollers' environment for them."""
        env = {}
        if self.proxy is not None:
            env["POLLER_PROXY_URL"] = f"http://hunt:{self.password}@{self.proxy.start()}"
        if self.sink is not None:
            env.update(OTEL_EXPORTER_OTLP_ENDPOINT=self.sink.__enter__(), OTEL_SERVICE_NAME="hunt")
        return env

    def disagrees(self, receiver: HostileReceiver, logs: list[Path]) -> list[str]:
        problems = []
        if self.sink is not None and not self.sink.requests:
            problems.append("tracing on, but no span was exported")
        if self.proxy is not None:
            problems += proxy_disagrees(receiver, self.proxy.proxy, self.password, logs)
        return problems

    def stop(self) -> None:
        if self.proxy is not None:
            self.proxy.stop()
        if self.sink is not None:
            self.sink.__exit__(None, None, None)


def hunt(seed: int, messages: int, deadline: float, tmp: Path) -> dict[str, Any]:
    """One seed's run; ``problems`` lists every broken invariant."""
    plan = Plan.draw(seed, duration=8.0)
    run = Run(plan)
    pg = EmbeddedPostgres(tmp / "pg", durable=False)
    stop_at_exit(pg)  # a run killed skips the finally below
    (tmp / "pg").mkdir(exist_ok=True)
    redis = None
    if plan.election == "redis":
        (tmp / "redis").mkdir(exist_ok=True)
        redis = EmbeddedRedis(tmp / "redis")
        stop_at_exit(redis)
    db_url = pg.start()
    redis_url = redis.start() if redis is not None else None
    migrate.upgrade(db_url)
    engine = sync_engine(db_url)
    secrets_key = new_key()  # secrets sealed at rest: the pollers must open them to sign
    secret = new_secret(plan.signing)
    credential = ("Authorization", f"Bearer hunt-{seed}-{new_key()[:12]}")  # sealed, sent
    receiver = HostileReceiver(seed, public_key(secret) or secret, credential)
    egress = Egress(plan)
    governed = hunt_governed.Governed(seed)
    stop = threading.Event()
    fleet: Fleet | None = None
    began = time.monotonic()
    try:
        url = receiver.start()
        via = egress.start()
        with engine.begin() as conn:
            create_endpoint(
                conn,
                "hostile",
                f"{url}/hook",
                lookup_url=f"{url}/lookup/{{idempotency_key}}" if plan.lookup else None,
                max_attempts=plan.max_attempts,
                max_in_flight=plan.max_in_flight,
                allow_private=True,
                on_failed_head=plan.on_failed_head,
                secret=secret,
                event_types=["hunt.*"],
                keyring=Keyring([secrets_key]),
                headers=dict([credential]),
                retry_schedule=plan.retry_schedule,
                max_age=plan.max_age,
                rate_limit=plan.rate_limit,
            )
            tenant_token = hunt_tenant.prepare(conn, url)
            governed.prepare(conn, Keyring([secrets_key]))
            if plan.doomed_at is not None:
                hunt_heavy.prepare(conn, url, secret=secret, headers=dict([credential]),
                                   keyring=Keyring([secrets_key]))  # fmt: skip
        governed.enqueue(engine)
        env = clean_env(
            POLLER_DATABASE_URL=db_url,
            POLLER_ELECTION=plan.election,
            POLLER_SHARDS="4",
            POLLER_LEASE_TTL=str(TTL),
            POLLER_CLAIM_LEASE=str(CLAIM_LEASE),
            POLLER_REQUEST_TIMEOUT="1",
            POLLER_CONNECT_TIMEOUT="0.5",
            POLLER_SWEEP_INTERVAL="0.3",
            POLLER_POLL_INTERVAL="0.3",
            POLLER_RETRY_SCHEDULE="[0.05, 0.2, 0.4]",
            POLLER_RETRY_AFTER_MAX="0.5",
            POLLER_SHUTDOWN_GRACE="0.5",
            POLLER_HTTP_CLIENT=plan.http_client,
            POLLER_ALLOW_PRIVATE_TARGETS="true",
            POLLER_LOG_FORMAT="json",
            POLLER_SECRETS_KEY=secrets_key,
            POLLER_CIRCUIT_FAILURES=str(plan.circuit_failures),
            POLLER_CIRCUIT_COOLDOWN="0.2",
            POLLER_CIRCUIT_COOLDOWN_MAX="0.8",
            POLLER_DISABLE_AFTER=str(plan.disable_after),
            **({"POLLER_REDIS_URL": redis_url} if redis_url else {}),
            **via,
        )
        fleet = Fleet(env, plan.pollers, tmp, run)
        # max_in_flight 1 drains a few a second against this receiver: the extreme is in
        # the behaviour, not the volume
        target = messages // 4 if plan.max_in_flight == 1 else messages
        run.began, run.began_at = time.monotonic(), datetime.now(UTC)
        threads = [
            threading.Thread(
                target=guarded(_feed, run.errors, run.feeding_done, run.faults_done),
                args=(engine, run, target),
                daemon=True,
            ),
            threading.Thread(
                target=guarded(_inject, run.errors, run.feeding_done, run.faults_done),
                args=(run, fleet, pg, redis, stop),
                daemon=True,
            ),
            threading.Thread(
                target=guarded(application, run.errors, run.app_done),
                args=(engine, run, ORDERED_KEYS, stop),
                daemon=True,
            ),
            threading.Thread(
                target=guarded(operator, run.errors, run.operator_done),
                args=(engine, run, receiver, url, Keyring([secrets_key]), stop),
                daemon=True,
            ),
            threading.Thread(
                target=guarded(hunt_tenant.tenant, run.errors, run.tenant_done),
                args=(engine, run, tenant_token, stop),
                daemon=True,
            ),
            threading.Thread(
                target=guarded(dba, run.errors, run.dba_done),
                args=(engine, run, stop),
                daemon=True,
            ),
            threading.Thread(
                target=guarded(hunt_heavy.heavy, run.errors, run.heavy_done),
                args=(engine, run, stop),
                daemon=True,
            ),
            threading.Thread(
                target=guarded(watch_circuits, run.errors),
                args=(engine, run, stop),
                daemon=True,
            ),
        ]
        if plan.outage is not None:
            outage = threading.Timer(plan.outage[0], receiver.down_for, (plan.outage[1],))
            outage.daemon = True
            threads.append(outage)
        for thread in threads:
            thread.start()
        until = began + deadline
        while time.monotonic() < until:
            actors = (run.feeding_done, run.faults_done, run.app_done, run.operator_done,
                      run.tenant_done, run.dba_done, run.heavy_done)  # fmt: skip
            if all(done.is_set() for done in actors) and _open_rows(engine) == 0:
                break
            time.sleep(0.3)
        else:
            run.errors.append(f"not settled within {deadline:g}s")
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
        fleet.check()
        fleet.stop_all()
        problems = check(engine, run, receiver, db_url, [p.log for p in fleet.procs])
        problems += egress.disagrees(receiver, [p.log for p in fleet.procs])
        problems += hunt_heavy.disagrees(engine, run, receiver)
        problems += hunt_tenant.disagrees(engine, run, dict(receiver.posts))
        problems += stuck_circuits(run)
        problems += governed.disagrees(engine)
        statuses = Counter(
            s for (s,) in engine.connect().execute(text("SELECT status FROM poller_outbox"))
        )
        return {
            "seed": seed,
            "plan": plan.describe() + governed.describe(),
            "messages": len(run.committed),
            "target": target,
            "delivered": statuses["delivered"],
            "failed": statuses["failed"],
            "cancelled": statuses["cancelled"],
            "posts": sum(receiver.posts.values()),
            "lookups": receiver.lookups,
            "behaviours": dict(receiver.behaviours),
            "injected": run.injected,
            "planned": len(plan.faults),
            "tenant_calls": len(run.tenant_log),
            "tenant_refused": sum(1 for c in run.tenant_log if c.endswith(" 404")),
            "cut_claims": run.cut_claims,
            "cut_completions": run.cut_completions,
            "handed_back": handed_back([p.log for p in fleet.procs]),
            "seconds": round(time.monotonic() - began, 1),
            "problems": problems,
        }
    finally:
        stop.set()
        if fleet is not None:
            for proc in fleet.procs:
                if proc.popen.poll() is None:
                    proc.stop(timeout=5, graceful=False)
        receiver.stop()
        governed.stop()
        egress.stop()
        engine.dispose()
        if redis is not None:
            redis.stop()
        pg.stop()


def summary(result: dict[str, Any]) -> str:
    verdict = "ok" if not result["problems"] else "PROBLEMS: " + "; ".join(result["problems"])
    return (
        f"{result['plan']} → {result['messages']} messages in {result['seconds']}s: "
        f"delivered {result['delivered']}, failed {result['failed']}, "
        f"cancelled {result['cancelled']}, "
        f"{result['posts']} POSTs, {result['lookups']} lookups, "
        f"{len(result['injected'])}/{result['planned']} faults injected, "
        f"{result['tenant_calls']} tenant API calls ({result['tenant_refused']} not found), "
        f"{result['cut_claims']} claim connections cut ({result['handed_back']} claims "
        f"handed back), {result['cut_completions']} completion connections cut; "
        f"{verdict}"
    )


def handed_back(logs: list[Path]) -> int:
    """Claims the pollers handed back unsent (their endpoint read failed after the claim)."""
    return sum(
        log.read_text(errors="replace").count("handed back unsent") for log in logs if log.exists()
    )


def replay_command(seed: int, messages: int) -> str:
    return f"python -m loadtest.hunt --seed {seed} --messages {messages}"


@contextlib.contextmanager
def _workdir(seed: int, keep: Path | None) -> Iterator[Path]:
    """A seed's working directory: a temporary one, or with ``--keep`` DIR/seed-N, made
    empty and left for reading after (where the pollers' logs say what they did)."""
    if keep is None:
        with tempfile.TemporaryDirectory(prefix=f"poller-hunt-{seed}-") as tmp:
            yield Path(tmp)
        return
    kept = keep / f"seed-{seed}"
    shutil.rmtree(kept, ignore_errors=True)
    kept.mkdir(parents=True)
    yield kept
    print(f"  files kept in {kept}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, action="append", help="replay this seed")
    parser.add_argument("--seeds", type=int, default=5, help="how many random seeds")
    parser.add_argument("--messages", type=int, default=400)
    parser.add_argument("--deadline", type=float, default=120.0)
    parser.add_argument(
        "--keep",
        type=Path,
        help="keep each seed's files (the pollers' logs, the servers' data) in DIR/seed-N",
    )
    args = parser.parse_args()
    # The feeder's pool failing to reset a connection while PostgreSQL restarts is
    # expected here (the feeder retries); its traceback would only bury the results.
    logging.getLogger("sqlalchemy.pool").setLevel(logging.CRITICAL)
    seeds = args.seed or [random.randrange(2**31) for _ in range(args.seeds)]
    failed = []
    for seed in seeds:
        with _workdir(seed, args.keep) as tmp:
            result = hunt(seed, args.messages, args.deadline, tmp)
        print(summary(result), flush=True)
        if result["problems"]:
            failed.append(seed)
            print(f"  replay: {replay_command(seed, args.messages)}", flush=True)
    print(f"{len(seeds) - len(failed)} passed, {len(failed)} failed", flush=True)
    if failed:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
