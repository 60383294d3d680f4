"""Claims: the fenced row writes that carry the at-least-once contract (SPEC §5).

A poller claims due rows in one statement (``FOR UPDATE SKIP LOCKED``), which
counts the attempt and stamps a new ``claim_token``. Every later write for that
attempt — delivered, retry, unknown, failed, released — is conditional on
``(id, claim_token, status = 'in_flight')``. If the claim expired and the row
was reclaimed (and maybe claimed again by another poller), the old poller's
write matches nothing, changes nothing, and is reported back as *stale*.

Outcomes are built with the functions of poller/outcomes.py (``delivered(msg, …)``,
``retry(msg, delay, …)`` …), which decide the row's next status from the
claimed row — e.g. a retryable failure on the last attempt becomes ``failed``.
:meth:`Claims.complete` applies any mix of them in one statement and records
each attempt in ``poller_delivery_attempts`` in the same transaction.

::

    claims = Claims(engine, poller_id="poller-1", claim_lease=60)
    batch = await claims.claim_batch(limit=100)
    result = await claims.complete([delivered(m, status_code=200) for m in batch])
    assert not result.stale
"""

from __future__ import annotations

import json
import operator
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from poller import queries
from poller.db import fetch
from poller.endpoints import Endpoint
from poller.events import EventSink, OperationalEvent
from poller.health import HealthPolicy
from poller.keyring import Keyring
from poller.ordering import ENDED, advance_keys
from poller.outcomes import ClaimedMessage, Outcome
from poller.schema import BUCKETS

ALL_BUCKETS: tuple[int, ...] = tuple(range(BUCKETS))


@dataclass(slots=True)
class ClaimBatch:
    messages: list[ClaimedMessage]
    endpoints: list[Endpoint]  # the claimed messages' endpoints the caller's cache lacked
    governed: int | None = None  # governed endpoints with due messages (None: not asked)


@dataclass(slots=True)
class CompletionResult:
    applied: list[int] = field(default_factory=list)
    stale: list[int] = field(default_factory=list)
    promoted: int = 0  # buckets where an ordered message became its key's head (now due)
    events: list[OperationalEvent] = field(default_factory=list)  # for hooks, after commit
    opened: int = 0  # circuits this completion opened


@dataclass(slots=True)
class ReclaimResult:
    pending: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    events: list[OperationalEvent] = field(default_factory=list)


TEXT_CAP = 2048


def clean_text(value: str, cap: int = TEXT_CAP) -> str:
    """Text PostgreSQL will store whatever a receiver sent: no NUL, no lone surrogate, capped."""
    if not value.isascii():
        value = value.encode("utf-8", "replace").decode("utf-8")
    return value.replace("\x00", "\ufffd")[:cap]


def outcomes_json(outcomes: Sequence[Outcome], poller_id: str) -> dict[str, str]:
    """COMPLETE_BATCH's parameters: the outcomes as one JSON array (None fields left out).

    Only the free-text fields can hold what a receiver sent; the rest are ours."""
    records = []
    for o in outcomes:
        values = zip(_OPTIONAL_FIELDS, _optional_values(o), strict=True)
        record = {k: v for k, v in values if v is not None}
        record["id"] = o.message_id
        for name in record.keys() & _FREE_TEXT:
            record[name] = clean_text(record[name])
        if o.started_at is not None:
            record["started_at"] = o.started_at.isoformat()
        records.append(record)
    return {"outcomes": json.dumps(records), "poller_id": clean_text(poller_id)}


_OPTIONAL_FIELDS = tuple(
    f for f in Outcome.__dataclass_fields__ if f not in ("message_id", "started_at")
)
_optional_values = operator.attrgetter(*_OPTIONAL_FIELDS)
_FREE_TEXT = frozenset({"error_class", "error_message", "response_excerpt", "disable_reason"})
_CLAIMED_FIELDS = tuple(ClaimedMessage.__dataclass_fields__)
_GOVERNED_FIELDS = (*_CLAIMED_FIELDS, "governed")


def buckets_literal(buckets: Sequence[int]) -> str:
    """A PostgreSQL array literal: far cheaper to send every claim than a list to adapt."""
    return "{" + ",".join(str(int(b)) for b in buckets) + "}"


ALL_BUCKETS_LITERAL = buckets_literal(ALL_BUCKETS)


class Claims:
    """Claim and complete rows for one poller; each call is one short transaction.

    ``stale_completions`` counts writes refused by the claim-token fence;
    ``stale_leader_claims`` counts shards refused by the shard fence.
    """

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        poller_id: str,
        claim_lease: float,
        keyring: Keyring | None = None,
        health: HealthPolicy | None = None,
        events: EventSink | None = None,
    ) -> None:
        self.engine = engine
        self.poller_id = poller_id
        self.claim_lease = claim_lease
        self.keyring = keyring  # opens the endpoints' secrets; None: POLLER_SECRETS_KEY's
        self.health = health or HealthPolicy()  # poller/health.py
        self._health_params = self.health.params()
        self.events = events or EventSink()  # poller/events.py
        self.stale_completions = 0
        self.stale_leader_claims = 0

    async def claim_batch(
        self, limit: int, buckets: Sequence[int] | None = None, **options: Any
    ) -> list[ClaimedMessage]:
        """:meth:`claim`, for callers that keep no endpoint cache: just the messages."""
        return (await self.claim(limit, buckets, **options)).messages

    async def claim(
        self,
        limit: int,
        buckets: Sequence[int] | None = None,
        *,
        in_flight: dict[int, int] | None = None,
        default_max_in_flight: int | None = None,
        fences: dict[int, int] | None = None,
        shards: int = 1,
        on_refused: Callable[[list[int]], None] | None = None,
        endpoint_versions: Mapping[int, datetime] | None = None,
        governed: bool = False,
    ) -> ClaimBatch:
        """Claim up to ``limit`` due rows of ``buckets`` (default: all), fairly per endpoint.

        An endpoint gets at most its ``max_in_flight`` (else ``default_max_in_flight``,
        else ``limit``) minus what ``in_flight`` says this poller holds for it.
        With ``fences`` ({shard: fence}, shard = bucket % ``shards``), PostgreSQL
        first checks and advances each shard's fence in the same transaction; a
        refused shard (a newer leader has it) claims nothing, and its number goes
        to ``on_refused``.

        ``endpoint_versions`` ({id: updated_at} of the caller's endpoint cache):
        every claimed message's endpoint that is missing or older there is read
        in the same transaction and returned in ``endpoints``. So once the claim
        has committed the caller needs no further I/O before sending: nothing
        can fail between a committed claim and its deliveries.

        With ``governed``, the messages of rate-limited endpoints and probes of
        open circuits are claimed first (CLAIM_GOVERNED, poller/health.py), and
        ``governed`` in the result says how many such endpoints had due messages.
        Without it, those endpoints are left alone.
        """
        if buckets is not None and not buckets:
            return ClaimBatch([], [])
        params = {
            "buckets": ALL_BUCKETS_LITERAL if buckets is None else buckets_literal(buckets),
            "limit": limit,
            "claimed_by": self.poller_id,
            "claim_lease": self.claim_lease,
            "in_flight": json.dumps(
                [{"endpoint_id": e, "n": n} for e, n in (in_flight or {}).items() if n]
            ),
            "default_max_in_flight": default_max_in_flight or limit,
            "salt": secrets.token_hex(4),
        }
        async with self.engine.begin() as conn:
            if fences:
                offered = json.dumps([{"shard": s, "fence": f} for s, f in fences.items()])
                accepted = {
                    row.shard
                    for row in await fetch(
                        conn, "FENCE_SHARDS", {"fences": offered, "holder": self.poller_id}
                    )
                }
                refused = sorted(set(fences) - accepted)
                if refused:
                    self.stale_leader_claims += len(refused)
                    if on_refused is not None:
                        on_refused(refused)
                allowed = [b for b in (buckets or ALL_BUCKETS) if b % shards in accepted]
                if not allowed:
                    return ClaimBatch([], [])
                params["buckets"] = buckets_literal(allowed)
            messages: list[ClaimedMessage] = []
            governed_count = None
            if governed:
                found = await fetch(conn, "CLAIM_GOVERNED", params, columns=_GOVERNED_FIELDS)
                governed_count = int(found[0][-1])
                messages = [ClaimedMessage(*row[:-1]) for row in found if row[0] is not None]
                params["limit"] = limit - len(messages)
            if limit > len(messages):
                claimed = await fetch(conn, "CLAIM_BATCH", params, columns=_CLAIMED_FIELDS)
                messages += [ClaimedMessage(*row) for row in claimed]
            versions = endpoint_versions or {}
            stale = sorted(
                {
                    m.endpoint_id
                    for m in messages
                    if m.endpoint_id not in versions
                    or versions[m.endpoint_id] < m.endpoint_updated_at
                }
            )
            endpoints = []
            if stale:
                rows = await conn.execute(queries.ENDPOINTS_BY_ID, {"ids": stale})
                endpoints = [Endpoint.from_row(row, self.keyring) for row in rows]
        return ClaimBatch(messages, endpoints, governed_count)

    async def extend(self, held: Mapping[int, int]) -> set[int]:
        """Extend the claim lease of held rows ({id: claim_token}); returns the ids still held.

        One statement for all of them, fenced by claim token: a row that was
        reclaimed (and maybe claimed again) is not extended and not returned.
        """
        if not held:
            return set()
        params = {
            "ids": list(held),
            "tokens": list(held.values()),
            "claim_lease": self.claim_lease,
        }
        async with self.engine.begin() as conn:
            rows = await fetch(conn, "EXTEND_CLAIMS", params)
        return {row.id for row in rows}

    async def complete(self, outcomes: Sequence[Outcome]) -> CompletionResult:
        """Apply outcomes (any mix) in one fenced statement; report which were stale.

        The endpoints' health learns from them in the same statement; operational
        events for what changed (and for messages that failed for good) are
        enqueued in the same transaction and returned for the in-process hooks.
        """
        if not outcomes:
            return CompletionResult()
        params = {**outcomes_json(outcomes, self.poller_id), **self._health_params}
        async with self.engine.begin() as conn:
            rows = await fetch(conn, "COMPLETE_BATCH", params)
            ended = [r.id for r in rows if r.ordering_key is not None and r.status in ENDED]
            promoted = 0
            if ended:  # COMPLETE_BATCH locked their keys' rows
                # No NOTIFY: a key's next message is in the same bucket, so this poller
                # claims it — the caller wakes its own claimer (``promoted``).
                moved = await advance_keys(conn, ended, locked=True, notify=False)
                promoted = sum(1 for row in moved if row.what == "promoted")
            transitions = (rows[0].events or []) if rows else []
            failed = [r.id for r in rows if r.status == "failed"]
            events = await self.events.record(conn, transitions, failed)
        applied = {row.id for row in rows}
        result = CompletionResult(
            applied=[o.message_id for o in outcomes if o.message_id in applied],
            stale=[o.message_id for o in outcomes if o.message_id not in applied],
            promoted=promoted,
            events=events,
            opened=sum(1 for t in transitions if t["was"] == "closed" and t["state"] == "open"),
        )
        self.stale_completions += len(result.stale)
        return result

    async def reclaim_expired(self, limit: int = 1000) -> ReclaimResult:
        """Return expired claims to pending + needs_lookup (or failed at max attempts)."""
        async with self.engine.begin() as conn:
            rows = (await conn.execute(queries.RECLAIM_EXPIRED, {"limit": limit})).all()
            failed = [row.id for row in rows if row.status == "failed"]
            if failed:
                await advance_keys(conn, failed)
            events = await self.events.record(conn, failed=failed)
        result = ReclaimResult(events=events)
        for row in rows:
            (result.failed if row.status == "failed" else result.pending).append(row.id)
        return result
