"""Deliveries under way: one task per claimed message, each ending in exactly one outcome.

:meth:`Dispatcher.start` is called for every message of a committed claim
(no I/O between the claim's commit and here: poller/claim/claimer.py). Its task
looks the message up first when an earlier outcome was unknown and the
endpoint has a ``lookup_url``, sends it otherwise, and hands the outcome to
the completer. Whatever happens, each claimed message reaches exactly one of:

* an outcome of the exchange (delivered, retry, unknown, failed, gone…);
* :func:`~poller.rules.outcomes.crashed` — anything the delivery raised (a receiver's
  header we failed to parse, a URL a client cannot encode, a malformed
  secret, a bug). A crash is an **attempt**: counted, recorded with the
  exception type as ``error_class``, backed off, ``failed`` after the last —
  never refunded, so nothing a receiver or a stored value can make us raise
  loops a message for ever;
* :func:`~poller.rules.outcomes.released` — only on graceful shutdown, for deliveries
  still running after the grace period (refunded a bounded number of times).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from poller.complete.completer import Completer
from poller.deliver import delivery
from poller.deliver.wire import Sender
from poller.endpoints.registry import Endpoint
from poller.errors import PayloadInvalid
from poller.observe import metrics
from poller.outbox.catalog import check_payload
from poller.redact import scrub_urls
from poller.rules import outcomes
from poller.rules.health import GOVERN_QUIET, is_endpoint_failure
from poller.rules.names import DOT_SEGMENTS
from poller.rules.outcomes import (
    Attempt,
    ClaimedMessage,
    LookupAnswer,
    Outcome,
    Verdict,
    clean_text,
)
from poller.rules.retry import backoff
from poller.rules.tracing import propagated, valid_traceparent
from poller.rules.version import version
from poller.settings import Settings

if TYPE_CHECKING:
    from poller.observe.delivery_metrics import Count, Histogram
    from poller.observe.otel import Span, Telemetry

log = logging.getLogger("poller.deliver.dispatcher")
CHILDREN_KEPT = 50_000  # labelled metric children a dispatcher keeps (endpoints × outcomes)


def _off_schema(msg: ClaimedMessage) -> str | None:
    """Why a SQL door's event breaks its type's schema (the database could not check it);
    None when it holds. The check is the one a Python door runs before its commit."""
    try:
        check_payload(msg.event_type, msg.payload_schema or "{}", msg.payload)
    except PayloadInvalid as exc:
        metrics.OFF_SCHEMA.inc()
        log.warning(
            "message %d: its payload breaks the schema of %r (published through a SQL "
            "door): failed unsent",
            msg.id,
            msg.event_type,
            extra={"message_id": msg.id},
        )
        return str(exc)
    return None


class EndpointCache:
    """The endpoints of claimed messages, kept fresh by the claim that returns them."""

    def __init__(self) -> None:
        self._by_id: dict[int, Endpoint] = {}
        self.versions: dict[int, datetime] = {}  # id -> updated_at, passed to every claim
        self.rate_limited: dict[int, int] = {}  # id -> bucket, of the cached rate-limited ones
        self._limited_buckets: Counter[int] = Counter()  # their buckets, with how many

    def update(self, endpoints: list[Endpoint]) -> None:
        for endpoint in endpoints:
            self._by_id[endpoint.id] = endpoint
            self.versions[endpoint.id] = endpoint.updated_at
            bucket = self.rate_limited.pop(endpoint.id, None)
            if bucket is not None:
                self._limited_buckets[bucket] -= 1
                if not self._limited_buckets[bucket]:
                    del self._limited_buckets[bucket]
            if endpoint.rate_limit is not None:
                self.rate_limited[endpoint.id] = endpoint.bucket
                self._limited_buckets[endpoint.bucket] += 1

    def rate_limited_in(self, bucket: int) -> bool:
        """Whether a cached endpoint of ``bucket`` has a rate limit."""
        return bucket in self._limited_buckets

    def __getitem__(self, endpoint_id: int) -> Endpoint:
        return self._by_id[endpoint_id]

    def get(self, endpoint_id: int) -> Endpoint | None:
        return self._by_id.get(endpoint_id)


@dataclasses.dataclass(slots=True)
class _Meters:
    """An endpoint's series that every delivery updates, looked up once."""

    seconds: Histogram  # webhook_poller_delivery_duration_seconds
    latency: Histogram  # webhook_poller_commit_to_delivery_seconds
    delivered: Count  # webhook_poller_delivery_outcomes_total, outcome="delivered"


class Dispatcher:
    def __init__(
        self,
        settings: Settings,
        sender: Sender,
        endpoints: EndpointCache,
        completer: Completer,
        *,
        on_room: Callable[[], None] = lambda: None,
        telemetry: Telemetry | None = None,
    ) -> None:
        self.settings = settings
        self.telemetry = telemetry  # the attempt spans (poller/observe/otel.py); None: off
        self.sender = sender
        self.endpoints = endpoints
        self.completer = completer
        self.on_room = on_room  # a delivery finished: the claimer may claim more
        self.user_agent = f"webhook-poller/{version()}"
        self.tasks: dict[asyncio.Task[None], ClaimedMessage] = {}
        self.in_flight: dict[int, int] = defaultdict(int)  # endpoint id -> deliveries
        # Capacity that grows with waiting: a delivery counts against concurrency for its
        # first waiting_after seconds (_young, in start order), then against max_waiting
        # (waiting) until it ends: a slow receiver's requests cost sockets and memory,
        # not the CPU the concurrency bounds, and must not take fast receivers' room.
        self._young: deque[tuple[float, asyncio.Task[None]]] = deque()
        self.waiting: set[asyncio.Task[None]] = set()
        self._waiting_after = settings.waiting_after
        self._ceiling = settings.concurrency + settings.max_waiting
        self._sending: set[int] = set()  # message ids whose request may be on the wire
        self._released: set[int] = set()  # released by drain(): their task writes nothing
        # A failed request keeps its endpoint's slot (in_flight) until its outcome is
        # written, when the circuit it may open is judged: message ids whose task ended
        # in such an outcome (_failing), then -> endpoint id while it waits (_held)
        self._failing: set[int] = set()
        self._held: dict[int, int] = {}
        self._span_ids: dict[int, str] = {}  # message id -> its send's span, for the log
        self.failed_at = -GOVERN_QUIET  # monotonic time of the last failed request
        # Labelled metric children, looked up once (prometheus' labels() locks and builds
        # a key on every call; per message that was a measurable share of a delivery).
        self._children: dict[tuple[object, tuple[str, ...]], Any] = {}
        # What every delivery counts, in plain numbers (poller/observe/delivery_metrics.py)
        self._counts = metrics.DELIVERIES.counts()
        self._sent = self._counts.attempt("send")
        self._by_name: dict[str, _Meters] = {}  # a delivery's three, per endpoint name
        # read when scraped, not set per delivery (a process runs one dispatcher)
        metrics.IN_FLIGHT.set_function(self.tasks.__len__)

    def _child(self, metric: Any, *labels: str) -> Any:
        key = (metric, labels)
        child = self._children.get(key)
        if child is None:
            if len(self._children) >= CHILDREN_KEPT:
                self._children.clear()
            child = self._children[key] = metric.labels(*labels)
        return child

    @property
    def room(self) -> int:
        """Deliveries that may start: ``concurrency`` less those at work (under way and
        not yet waiting: :meth:`_settle`), less the outcomes waiting to be written beyond
        one batch — so claims slow down to what the completer writes (else a drain held
        ever more delivered, unwritten rows: memory, heartbeats, and duplicates if the
        process died) — and never past ``concurrency + max_waiting`` in all."""
        self._settle(time.monotonic())
        completer = self.completer
        unwritten = completer.queued - completer.batch_limit
        tasks = len(self.tasks)
        room = self.settings.concurrency - (tasks - len(self.waiting)) - max(unwritten, 0)
        return min(room, self._ceiling - tasks)

    def _settle(self, now: float) -> None:
        """Deliveries under way for waiting_after seconds are waiting from now on."""
        young, tasks = self._young, self.tasks
        since = now - self._waiting_after
        while young and young[0][0] <= since:
            task = young.popleft()[1]
            if task in tasks:
                self.waiting.add(task)

    def waits_in(self) -> float | None:
        """Seconds until the oldest delivery at work starts waiting (room for a claim
        then), or None if none is at work."""
        young, tasks = self._young, self.tasks
        while young and young[0][1] not in tasks:
            young.popleft()
        if not young:
            return None
        return max(young[0][0] + self._waiting_after - time.monotonic(), 0.0)

    def slow_endpoints(self) -> set[int]:
        """The endpoints with a delivery waiting (near ``max_waiting`` they get no more)."""
        tasks = self.tasks
        return {tasks[task].endpoint_id for task in self.waiting}

    @property
    def near_ceiling(self) -> bool:
        """Whether waiting deliveries leave less than one concurrency's worth of room."""
        return len(self.tasks) + self.settings.concurrency >= self._ceiling

    def in_flight_for_shard(self, shard: int, shards: int) -> int:
        """Deliveries under way for messages of ``shard`` (a shard being handed over)."""
        return sum(1 for msg in self.tasks.values() if msg.bucket % shards == shard)

    def start(self, msg: ClaimedMessage, started: float) -> None:
        """Deliver ``msg``, claimed at ``started`` (monotonic: the claim's, read once)."""
        self.in_flight[msg.endpoint_id] += 1
        task = asyncio.create_task(self._deliver(msg), name=f"deliver-{msg.id}")
        self.tasks[task] = msg
        self._young.append((started, task))
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        msg = self.tasks.pop(task)
        self.waiting.discard(task)
        self._sending.discard(msg.id)
        if msg.id in self._failing:  # its slot waits for the outcome's write (written())
            self._failing.discard(msg.id)
            self._held[msg.id] = msg.endpoint_id
        else:
            self._free_slot(msg.endpoint_id)
        if not task.cancelled() and task.exception() is not None:  # pragma: no cover - a bug
            self.completer.put(self._crash(msg, task.exception(), 0.0, datetime.now(UTC)))
        self.on_room()

    def _free_slot(self, endpoint_id: int) -> None:
        self.in_flight[endpoint_id] -= 1
        if not self.in_flight[endpoint_id]:
            del self.in_flight[endpoint_id]

    def written(self, outcomes: Sequence[Outcome]) -> None:
        """Outcomes were written: failed requests give their endpoint's slot back. Until
        then an endpoint that fails fast is not sent more than its ``max_in_flight``
        before the completion that may open its circuit is judged (under load it was
        sent ten rounds of it)."""
        for outcome in outcomes:
            endpoint_id = self._held.pop(outcome.message_id, None)
            if endpoint_id is not None:
                self._free_slot(endpoint_id)
            else:  # written before its task's end was handled: that frees the slot
                self._failing.discard(outcome.message_id)

    async def drain(self, grace: float) -> int:
        """Let deliveries finish up to ``grace`` seconds; release the rest. Returns how many."""
        pending = set(self.tasks)
        if pending:
            log.info("waiting up to %.1fs for %d deliveries", grace, len(pending))
            _, pending = await asyncio.wait(pending, timeout=grace)
        for task in pending:
            msg = self.tasks[task]
            task.cancel()
            self._released.add(msg.id)
            self.completer.put(outcomes.released(msg, maybe_sent=msg.id in self._sending))
            self._counts.outcome(self._name(msg), "released").inc()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        return len(pending)

    # -- one delivery ---------------------------------------------------------------

    async def _deliver(self, msg: ClaimedMessage) -> None:
        began = time.perf_counter()
        try:
            outcome = await self._exchange(msg)
        except Exception as exc:  # a crash after the claim is an attempt, never a refund
            spent = time.perf_counter() - began  # the clock is read for a crash only
            started_at = datetime.now(UTC) - timedelta(seconds=spent)
            outcome = self._crash(msg, exc, spent * 1000, started_at)
        if msg.id in self._released:  # the shutdown released it while a client swallowed
            return  # the cancellation: one outcome per claim
        self._record(outcome, msg)
        if is_endpoint_failure(outcome.status_code, outcome.outcome):
            self._failing.add(msg.id)
        self.completer.put(outcome)

    async def _exchange(self, msg: ClaimedMessage) -> Outcome:
        outcome = await self._lookup_or_send(msg)
        if is_endpoint_failure(outcome.status_code, outcome.outcome):
            self.failed_at = time.monotonic()  # a circuit may open: govern often (claimer)
            if msg.probe:
                outcome = outcomes.probe_failed(msg, outcome)
        return outcome

    def _lease_short(self, msg: ClaimedMessage, timeout: float, what: str) -> bool:
        """No lookup or send starts unless the claim surely outlasts it (Completer.can_start):
        else the row could be reclaimed while the request is on the wire."""
        if self.completer.can_start(msg.id, timeout):
            return False
        metrics.LEASE_SHORT.inc()
        log.warning(
            "message %d: too little claim lease left for a %s of up to %.1fs (heartbeat "
            "late, or this process was paused); handing it back",
            msg.id,
            what,
            timeout,
            extra={"message_id": msg.id},
        )
        return True

    async def _lookup_or_send(self, msg: ClaimedMessage) -> Outcome:
        endpoint = self.endpoints[msg.endpoint_id]
        timeout = min(
            endpoint.timeout or self.settings.request_timeout, self.settings.request_timeout
        )
        # A key stored before dot segments were refused is never looked up: its
        # lookup URL would resolve to another resource (poller/outbox/enqueue.py).
        looks_up = (
            msg.needs_lookup
            and endpoint.lookup_url is not None
            and msg.idempotency_key not in DOT_SEGMENTS
        )
        # Past its age limit it is never sent again; one that may have arrived is
        # looked up first, so a message the receiver has is still delivered.
        age = 0.0  # the clock is read only when an age limit asks for it
        if endpoint.max_age is not None:
            age = (datetime.now(UTC) - msg.created_at).total_seconds()
        # or claimed as such (by the database's clock, CLAIM_GOVERNED): never sent
        expired = msg.expired or (endpoint.max_age is not None and age > endpoint.max_age)
        if expired and not looks_up:
            return outcomes.expired(msg, endpoint.max_age or 0.0, age)
        if msg.payload_schema is not None and (said := _off_schema(msg)) is not None:
            return outcomes.off_schema(msg, said)
        if self._lease_short(msg, timeout, "lookup" if looks_up else "send"):
            return outcomes.released(msg)
        if looks_up:
            answer, attempt = await self._look_up(msg, endpoint, timeout)
            self._child(metrics.LOOKUPS, answer.value).inc()
            self._observe("lookup", endpoint, attempt)
            if answer is LookupAnswer.FOUND or (answer is LookupAnswer.ERROR and not expired):
                return delivery.lookup_outcome(
                    msg, attempt, self.settings, delivery.schedule_of(endpoint, self.settings)
                )
            if expired:
                return outcomes.expired(msg, endpoint.max_age or 0.0, age)
            if self._lease_short(msg, timeout, "send"):  # the lookup took the lease
                return outcomes.released(msg)
        self._sending.add(msg.id)
        attempt = await self._send(msg, endpoint, timeout)
        self._observe("send", endpoint, attempt)
        outcome = delivery.to_outcome(
            msg, attempt, self.settings, delivery.schedule_of(endpoint, self.settings)
        )
        if attempt.verdict is Verdict.GONE:
            log.warning("endpoint %s answered 410 Gone: disabling it", endpoint.name)
            outcome = dataclasses.replace(outcome, disable_reason=f"410 Gone from {endpoint.name}")
        if attempt.retry_after is not None:  # 429/503: the whole endpoint waits (health.py)
            pause = min(attempt.retry_after, self.settings.retry_after_max)
            outcome = dataclasses.replace(outcome, pause=pause)
            metrics.ENDPOINT_PAUSES.inc()
        return outcome

    # -- one exchange, traced (poller/observe/otel.py, poller/rules/tracing.py) ------------------

    def _trace_headers(
        self, endpoint: Endpoint, msg: ClaimedMessage, span: Span | None
    ) -> dict[str, str] | None:
        """What the receiver gets of the trace: the attempt's span as its parent, else the
        application's context as stored; nothing when the message has none, or the
        endpoint or POLLER_TRACE_PROPAGATION refuses it."""
        if msg.traceparent is None or not endpoint.trace_context:
            return None
        if not self.settings.trace_propagation:
            return None
        return propagated(msg.traceparent if span is None else span.traceparent, msg.tracestate)

    def _span(self, kind: str, endpoint: Endpoint, msg: ClaimedMessage) -> Span | None:
        return None if self.telemetry is None else self.telemetry.start(kind, endpoint, msg)

    def _end(self, span: Span | None, attempt: Attempt | None, said: str, failed: bool) -> None:
        """The attempt's span ends: with its attempt, or (None) cut short by an exception."""
        telemetry = self.telemetry
        if telemetry is None:
            return
        if attempt is None:
            telemetry.end(span)
        else:
            telemetry.finish(span, attempt, said, failed=failed)

    async def _look_up(
        self, msg: ClaimedMessage, endpoint: Endpoint, timeout: float
    ) -> tuple[LookupAnswer, Attempt]:
        span = self._span("lookup", endpoint, msg)
        try:
            answer, attempt = await delivery.lookup(
                self.sender,
                endpoint,
                msg,
                timeout=timeout,
                user_agent=self.user_agent,
                trace=self._trace_headers(endpoint, msg, span),
            )
        except BaseException:
            self._end(span, None, "", True)
            raise
        self._end(span, attempt, answer.value, answer is LookupAnswer.ERROR)
        return answer, attempt

    async def _send(self, msg: ClaimedMessage, endpoint: Endpoint, timeout: float) -> Attempt:
        span = self._span("send", endpoint, msg)
        if span is not None:
            self._span_ids[msg.id] = span.span_id
        try:
            attempt = await delivery.send(
                self.sender,
                endpoint,
                msg,
                timeout=timeout,
                user_agent=self.user_agent,
                permanent_statuses=self.settings.permanent_statuses,
                trace=self._trace_headers(endpoint, msg, span),
            )
        except BaseException:
            self._end(span, None, "", True)
            raise
        self._end(span, attempt, attempt.verdict.value, attempt.verdict is not Verdict.DELIVERED)
        return attempt

    def _schedule(self, msg: ClaimedMessage) -> tuple[float, ...]:
        endpoint = self.endpoints.get(msg.endpoint_id)
        if endpoint is None:  # pragma: no cover - a crash before its endpoint was known
            return self.settings.retry_schedule
        return delivery.schedule_of(endpoint, self.settings)

    def _crash(
        self, msg: ClaimedMessage, exc: BaseException | None, duration_ms: float, at: datetime
    ) -> Outcome:
        name = type(exc).__name__
        log.error(
            "delivery of message %d crashed (%s); counted as attempt %d of %d",
            msg.id,
            name,
            msg.attempts,
            msg.max_attempts,
            exc_info=exc,
            extra={"message_id": msg.id, "attempt": msg.attempts, "error": name},
        )
        return outcomes.crashed(
            msg,
            backoff(self._schedule(msg), msg.attempts),
            maybe_sent=msg.id in self._sending,
            error_class=name,
            error_message=clean_text(scrub_urls(f"{name}: {exc}"), 500),
            started_at=at,
            duration_ms=duration_ms,
        )

    # -- accounting -------------------------------------------------------------------

    def _name(self, msg: ClaimedMessage) -> str:
        try:
            return self.endpoints[msg.endpoint_id].name
        except KeyError:  # pragma: no cover - claimed rows always have a cached endpoint
            return str(msg.endpoint_id)

    def _meters(self, name: str) -> _Meters:
        meters = self._by_name.get(name)
        if meters is None:
            if len(self._by_name) >= CHILDREN_KEPT:
                self._by_name.clear()  # the series stay in the counts: only the lookup goes
            counts = self._counts
            meters = self._by_name[name] = _Meters(
                counts.duration(name),
                counts.commit_to_delivery(name),
                counts.outcome(name, "delivered"),
            )
        return meters

    def _observe(self, kind: str, endpoint: Endpoint, attempt: Attempt) -> None:
        (self._sent if kind == "send" else self._counts.attempt(kind)).inc()
        self._meters(endpoint.name).seconds.observe(attempt.duration_ms / 1000)

    def _record(self, outcome: Outcome, msg: ClaimedMessage) -> None:
        name = self._name(msg)
        span_id = self._span_ids.pop(msg.id, None)
        if outcome.status == "delivered":
            meters = self._meters(name)
            meters.delivered.inc()
            # commit to the answer: the attempt's start and duration, no clock read
            latency = (outcome.started_at or datetime.now(UTC)) - msg.created_at
            latency_s = latency.total_seconds() + (outcome.duration_ms or 0.0) / 1000
            # an exemplar names the delivery's trace (OpenMetrics scrapes show it)
            exemplar = (
                {"trace_id": msg.traceparent[3:35], "span_id": span_id or msg.traceparent[36:52]}
                if msg.traceparent is not None and valid_traceparent(msg.traceparent)
                else None
            )
            meters.latency.observe(max(0.0, latency_s), exemplar)
            return
        # Final states by their name (a last attempt's "unknown" or "crashed" is "failed"),
        # so alerts on outcome="failed" count exactly the messages that failed for good.
        final = outcome.status == "failed"
        self._counts.outcome(name, outcome.status if final else outcome.outcome).inc()
        fields = {
            "message_id": msg.id,
            "key": msg.idempotency_key,
            "attempt": msg.attempts,
            "endpoint": name,
            "outcome": outcome.outcome,
            "status_code": outcome.status_code,
            "error": outcome.error_message,
        }
        if msg.traceparent is not None and valid_traceparent(msg.traceparent):
            # the trace this delivery belongs to, and its attempt's span (poller/observe/otel.py)
            fields["trace_id"] = msg.traceparent[3:35]
            fields["span_id"] = span_id or msg.traceparent[36:52]
        if outcome.status == "failed":
            log.warning(
                "message %d failed for good: %s", msg.id, outcome.error_message, extra=fields
            )
        else:
            log.info(
                "delivery of message %d failed (%s), retrying",
                msg.id,
                outcome.error_message or outcome.error_class,
                extra=fields,
            )
