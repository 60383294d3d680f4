"""Operational events: what happened to endpoints and messages, told to operators.

An event is published when an endpoint's circuit opens or closes, when an
endpoint is disabled (410 Gone, or failing for ``POLLER_DISABLE_AFTER``), and
when a message fails for good. It goes two ways:

* **a webhook** to the endpoint named by ``POLLER_OPERATOR_ENDPOINT`` (an
  ordinary endpoint with its own URL and secret), enqueued in the outbox *in
  the same transaction* as the change it reports — so it is signed, retried
  and as reliable as any message, and never reported for a change that rolled
  back. Nothing is reported about the operator endpoint itself (its failures
  would otherwise feed themselves);
* **a Python hook** (``Poller.on_event``), called in process after the change
  committed; a hook that raises is logged and does not disturb delivery.

The body (event type = ``type``)::

    {
      "type": "endpoint.circuit_opened",      # .circuit_closed, endpoint.disabled, message.failed
      "occurred_at": "2026-11-30T09:12:03.120000+00:00",
      "endpoint": {"id": 3, "name": "billing"},
      "reason": "10 failed sends in a row (last: HTTP 503)",
      "data": {...}                            # per type, below
    }

==========================  ===================================================================
type                        data
==========================  ===================================================================
endpoint.circuit_opened     ``consecutive_failures``, ``cooldown_seconds``, ``last_error``
endpoint.circuit_closed     ``was`` (open or half_open)
endpoint.disabled           ``last_error``
message.failed              ``message_id``, ``event_type``, ``idempotency_key``, ``attempts``,
                            ``last_status_code``, ``last_error_class``
==========================  ===================================================================

No payload, secret, URL or response body is ever included: ids, names and
reasons (``HTTP 503``, or the error's class such as ``ConnectError``) only.
Each event's idempotency key (the ``webhook-id``) is ``poller-event-`` and a
random UUID.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from poller.errors import PollerError
from poller.store import queries

log = logging.getLogger("poller.rows.events")

CIRCUIT_OPENED = "endpoint.circuit_opened"
CIRCUIT_CLOSED = "endpoint.circuit_closed"
ENDPOINT_DISABLED = "endpoint.disabled"
MESSAGE_FAILED = "message.failed"
EVENT_TYPES = (CIRCUIT_OPENED, CIRCUIT_CLOSED, ENDPOINT_DISABLED, MESSAGE_FAILED)

EventHook = Callable[["OperationalEvent"], object]


@dataclass(frozen=True, slots=True)
class OperationalEvent:
    """One operational event (the webhook body is :meth:`body`)."""

    type: str
    endpoint_id: int
    endpoint: str
    reason: str
    occurred_at: datetime
    data: dict[str, Any] = field(default_factory=dict)

    def body(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "occurred_at": self.occurred_at.isoformat(),
            "endpoint": {"id": self.endpoint_id, "name": self.endpoint},
            "reason": self.reason,
            "data": dict(self.data),
        }

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def circuit_events(
    transitions: Iterable[dict[str, Any]], names: dict[int, str], now: datetime
) -> list[OperationalEvent]:
    """Events for JUDGE_HEALTH's ``events``: circuits opened or closed, endpoints disabled.

    A failed probe (half_open → open) is not an event: the circuit was open already.
    """
    events = []
    for t in transitions:
        endpoint_id = int(t["endpoint_id"])
        name = names.get(endpoint_id, str(endpoint_id))
        error = t.get("error") or "unknown error"
        if t["was"] == "closed" and t["state"] == "open":
            failures = int(t["failures"])
            events.append(
                OperationalEvent(
                    CIRCUIT_OPENED,
                    endpoint_id,
                    name,
                    f"{failures} failed sends in a row (last: {error})",
                    now,
                    {
                        "consecutive_failures": failures,
                        "cooldown_seconds": t["cooldown"],
                        "last_error": error,
                    },
                )
            )
        elif t["was"] != "closed" and t["state"] == "closed":
            events.append(
                OperationalEvent(
                    CIRCUIT_CLOSED,
                    endpoint_id,
                    name,
                    "a delivery succeeded",
                    now,
                    {"was": t["was"]},
                )
            )
        if t.get("disabled"):
            events.append(
                OperationalEvent(
                    ENDPOINT_DISABLED,
                    endpoint_id,
                    name,
                    "410 Gone"
                    if t.get("gone")
                    else "failing with no success (POLLER_DISABLE_AFTER)",
                    now,
                    {"last_error": error},
                )
            )
    return events


class EventSink:
    """Publishes operational events: into the outbox for the operator endpoint, and to hooks."""

    def __init__(self, operator_endpoint: str | None = None) -> None:
        self.operator_endpoint = operator_endpoint
        self.hooks: list[EventHook] = []
        self.published = 0  # events enqueued for the operator endpoint
        self._operator_id: int | None = None
        self._warned_at = 0.0

    async def record(
        self,
        conn: AsyncConnection,
        transitions: Sequence[dict[str, Any]] = (),
        failed: Sequence[int] = (),
    ) -> list[OperationalEvent]:
        """Build the events of a change in ``conn``'s transaction and enqueue them there.

        ``transitions``: JUDGE_HEALTH's ``events``; ``failed``: ids of messages
        that just failed for good. Returns the events, for :meth:`notify` after commit.
        """
        if not self.hooks and self.operator_endpoint is None:
            failed = ()  # nobody listens: spare the failing path a query per batch
        if not transitions and not failed:
            return []
        now = datetime.now(UTC)
        events: list[OperationalEvent] = []
        if transitions:
            ids = sorted({int(t["endpoint_id"]) for t in transitions})
            rows = (await conn.execute(queries.EVENT_ENDPOINT_NAMES, {"ids": ids})).all()
            events += circuit_events(transitions, {r.id: r.name for r in rows}, now)
        if failed:
            rows = (await conn.execute(queries.FAILED_MESSAGES, {"ids": list(failed)})).all()
            events += [
                OperationalEvent(
                    MESSAGE_FAILED,
                    r.endpoint_id,
                    r.endpoint,
                    f"failed for good after {r.attempts} attempts"
                    + (f" (last: HTTP {r.last_status_code})" if r.last_status_code else ""),
                    now,
                    {
                        "message_id": r.id,
                        "event_type": r.event_type,
                        "idempotency_key": r.idempotency_key,
                        "attempts": r.attempts,
                        "last_status_code": r.last_status_code,
                        "last_error_class": r.error_class,
                    },
                )
                for r in rows
            ]
        if self.operator_endpoint is not None:
            events = [e for e in events if e.endpoint != self.operator_endpoint]
            if events:
                await self._enqueue(conn, events)
        return events

    async def _enqueue(self, conn: AsyncConnection, events: Sequence[OperationalEvent]) -> None:
        from poller.outbox.enqueue import Message, enqueue_many_async

        assert self.operator_endpoint is not None
        messages = [
            Message(
                endpoint=self.operator_endpoint,
                event_type=e.type,
                payload=e.body(),
                idempotency_key=f"poller-event-{uuid.uuid4()}",
            )
            for e in events
        ]
        try:
            async with conn.begin_nested():  # a refusal must not undo the change it reports
                await enqueue_many_async(conn, messages)
        except PollerError as exc:  # e.g. the operator endpoint was removed
            if time.monotonic() - self._warned_at > 60:
                self._warned_at = time.monotonic()
                log.warning(
                    "operational events for POLLER_OPERATOR_ENDPOINT=%s not enqueued: %s",
                    self.operator_endpoint,
                    exc,
                )
            return
        self.published += len(messages)

    def notify(self, events: Iterable[OperationalEvent]) -> None:
        """Call the hooks (after commit). A hook that raises is logged, never propagated."""
        for event in events:
            if event.type != MESSAGE_FAILED:  # those are logged by the dispatcher already
                log.info(
                    "operational event %s: endpoint %s: %s",
                    event.type,
                    event.endpoint,
                    event.reason,
                    extra={"event": event.type, "endpoint": event.endpoint},
                )
            for hook in self.hooks:
                try:
                    hook(event)
                except Exception:
                    log.exception("operational event hook %r raised", hook)
