"""Claims: the fenced row writes that carry the at-least-once contract (docs/explanation/design.md).

A poller claims due rows in one statement (``FOR UPDATE SKIP LOCKED``), which
counts the attempt and stamps a new ``claim_token``. Every later write for that
attempt — delivered, retry, unknown, failed, released — is conditional on
``(id, claim_token, status = 'in_flight')``. If the claim expired and the row
was reclaimed (and maybe claimed again by another poller), the old poller's
write matches nothing, changes nothing, and is reported back as *stale*.

Outcomes are built with the functions of poller/rules/outcomes.py (``delivered(msg, …)``,
``retry(msg, delay, …)`` …), which decide the row's next status from the
claimed row — e.g. a retryable failure on the last attempt becomes ``failed``.
:meth:`Claims.complete` hands any mix of them to the claims' :class:`Completions`
(poller/rows/completions.py), which writes them in one statement and records each
attempt in ``poller_delivery_attempts`` in the same transaction.

::

    claims = Claims(engine, poller_id="poller-1", claim_lease=60)
    batch = await claims.claim_batch(limit=100)
    result = await claims.complete([delivered(m, status_code=200) for m in batch])
    assert not result.stale
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from poller.endpoints.registry import Endpoint
from poller.rows.completions import CompletionResult, Completions
from poller.rows.events import EventSink
from poller.rules.health import HealthPolicy
from poller.rules.keyring import Keyring
from poller.rules.outcomes import ClaimedMessage, Outcome
from poller.store import queries
from poller.store.db import Autocommit, fetch
from poller.store.schema import BUCKETS

ALL_BUCKETS: tuple[int, ...] = tuple(range(BUCKETS))


@dataclass(frozen=True, slots=True)
class Extended:
    """What a heartbeat did (Claims.extend): the rows whose lease it extended, and those
    still this claim's that someone else held locked (extended at a later beat)."""

    extended: set[int]
    busy: set[int]


@dataclass(slots=True)
class ClaimBatch:
    messages: list[ClaimedMessage]
    endpoints: list[Endpoint]  # the claimed messages' endpoints the caller's cache lacked
    governed: int | None = None  # not 0: governed work is due, come back soon (None: not asked)
    # Claimed, but their endpoints could not be read (``error``): to hand back unsent.
    unready: list[ClaimedMessage] = field(default_factory=list)
    error: Exception | None = None


_CLAIMED_FIELDS = tuple(ClaimedMessage.__dataclass_fields__)
_GOVERNED_FIELDS = (
    *_CLAIMED_FIELDS, "spend", "governed", "gafter_bucket", "gafter", "accepted"
)  # fmt: skip


def _spend(rows: Sequence[Sequence[Any]]) -> dict[str, Any] | None:
    """SPEND_TOKENS's parameters for CLAIM_GOVERNED's ``rows`` (None: it found nothing)."""
    spend = rows[0][-5]
    return None if spend == "[]" else {"spend": spend}


_FENCED_FIELDS = (*_CLAIMED_FIELDS, "accepted")


def _fences_json(fences: Mapping[int, int]) -> str:
    return json.dumps([{"shard": s, "fence": f} for s, f in fences.items()])


def _stale_endpoints(
    messages: Sequence[ClaimedMessage], versions: Mapping[int, datetime]
) -> list[int]:
    """The endpoints of ``messages`` that ``versions`` lacks or has an older version of."""
    return sorted(
        {
            m.endpoint_id
            for m in messages
            if m.endpoint_id not in versions or versions[m.endpoint_id] < m.endpoint_updated_at
        }
    )


def buckets_literal(buckets: Sequence[int]) -> str:
    """A PostgreSQL array literal, in ascending order (the claim's walk takes the buckets
    in the array's order): far cheaper to send every claim than a list to adapt."""
    return "{" + ",".join(str(b) for b in sorted({int(b) for b in buckets})) + "}"


ALL_BUCKETS_LITERAL = buckets_literal(ALL_BUCKETS)
LEAST_ID = -(2**63)  # the least bigint: an endpoint's identity takes any id it is given
NO_BUCKET = -1  # below every bucket: the claim's walk starts at the first of its buckets


class Claims:
    """Claim rows for one poller, keep their leases, and complete them through
    ``completions`` (its health policy, event sink and ``follow_ups_apart``
    are given here); each call is one short transaction.

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
        follow_ups_apart: bool = False,
    ) -> None:
        self.engine = engine
        self.direct = Autocommit(engine)  # the plain claim: one statement, no transaction
        self.poller_id = poller_id
        self.claim_lease = claim_lease
        self.keyring = keyring  # opens the endpoints' secrets; None: POLLER_SECRETS_KEY's
        self.completions = Completions(
            engine,
            poller_id=poller_id,
            health=health,
            events=events,
            follow_ups_apart=follow_ups_apart,
        )
        self.stale_leader_claims = 0
        self._literals: dict[tuple[int, ...], str] = {}  # buckets -> buckets_literal
        # CLAIM_BATCH takes endpoints in turn: the next claim starts after the last
        # endpoint this one took from (the first, at the least bigint: any id)
        self._after = (NO_BUCKET, LEAST_ID)  # (bucket, endpoint): where the walk goes on
        self._resume: tuple[int, int] | None = None  # the turn, while a claim jumped ahead
        self._gafter = (NO_BUCKET, LEAST_ID)  # CLAIM_GOVERNED's, as it says

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
        full_tenants: Sequence[str] = (),
        first_bucket: int | None = None,
    ) -> ClaimBatch:
        """Claim up to ``limit`` due rows of ``buckets`` (default: all), fairly per endpoint.

        An endpoint gets at most its ``max_in_flight`` (else ``default_max_in_flight``,
        else ``limit``) minus what ``in_flight`` says this poller holds for it; the
        endpoints of ``full_tenants`` get none.
        With ``fences`` ({shard: fence}, shard = bucket % ``shards``), PostgreSQL
        first checks and advances each shard's fence in the same transaction; a
        refused shard (a newer leader has it) claims nothing, and its number goes
        to ``on_refused``.

        ``endpoint_versions`` ({id: updated_at} of the caller's endpoint cache):
        every claimed message's endpoint that is missing or older there is read
        and returned in ``endpoints``, so the caller needs no further I/O before
        sending. With it, the claim is **one statement on its own**
        (CLAIM_BATCH checks the fences and claims; :class:`~poller.store.db.Autocommit`),
        the cheapest way to claim, after CLAIM_GOVERNED (which checks them too)
        when ``governed``; the endpoints are read after it committed: if that read
        fails (or CLAIM_BATCH does, after CLAIM_GOVERNED committed its claims), the
        messages come back in ``unready`` with the ``error``, for the
        caller to hand back unsent (``outcomes.released``: pending again, the
        attempt refunded) — a claimed message is sent with its endpoint or handed
        back, never left. Without it, everything runs in one transaction (the
        fences first), rolled back whole if a part fails.

        With ``governed``, the messages of rate-limited endpoints and probes of
        open circuits are claimed first (CLAIM_GOVERNED, poller/rules/health.py), and
        ``governed`` in the result is not 0 while such work is due (taken, or
        waiting for a token or room). Without it, those endpoints are left alone.

        ``first_bucket`` (one a NOTIFY named: a message was just committed there): this
        claim walks from that bucket's first endpoint, and the turn of the next claims
        is left where it was. Else a new message for an endpoint that holds nothing
        waited for the walk to come round to it past every endpoint with a backlog.
        """
        if buckets is not None and not buckets:
            return ClaimBatch([], [])
        after = self._cursor(buckets)
        if first_bucket is not None and (buckets is None or first_bucket in buckets):
            after, self._resume = (first_bucket, LEAST_ID), after
        params = {
            "buckets": self._buckets_literal(buckets),
            "limit": limit,
            "claimed_by": self.poller_id,
            "claim_lease": self.claim_lease,
            "in_flight": json.dumps(
                [{"endpoint_id": e, "n": n} for e, n in (in_flight or {}).items() if n]
            ),
            "default_max_in_flight": default_max_in_flight or limit,
            "after_bucket": after[0],
            "after": after[1],
            "gafter_bucket": self._gafter[0],
            "gafter": self._gafter[1],
            "full_tenants": list(full_tenants),
            "fences": None,
            "shards": shards,
        }
        if endpoint_versions is None:
            return await self._claim_in_transaction(
                limit, params, fences, buckets, shards, on_refused, endpoint_versions, governed
            )
        if fences:
            params["fences"] = _fences_json(fences)
        accepted: set[int] = set(fences or ())
        messages: list[ClaimedMessage] = []
        governed_count = None
        if governed:
            found = await self.direct.fetch_then(
                queries.CLAIM_GOVERNED, params, queries.SPEND_TOKENS, _spend,
                columns=_GOVERNED_FIELDS,
            )  # fmt: skip
            governed_count = self._governed(found)
            accepted.intersection_update(found[0][-1] or ())
            messages = [ClaimedMessage(*row[:-5]) for row in found if row[0] is not None]
            params["limit"] = limit - len(messages)
        try:
            if limit > len(messages) and (accepted or not fences):
                rows = await self.direct.fetch(queries.CLAIM_BATCH, params, columns=_FENCED_FIELDS)
                accepted.intersection_update(rows[0][-1] or ())
                messages += self._in_turn(rows)
            endpoints = []
            if stale := _stale_endpoints(messages, endpoint_versions):
                found = await self.direct.fetch(queries.ENDPOINTS_BY_ID, {"ids": stale})
                endpoints = [Endpoint.from_row(row, self.keyring) for row in found]
        except Exception as exc:
            if not messages:  # nothing committed: a failed claim like any other
                raise
            # a statement committed claims (CLAIM_GOVERNED's, or CLAIM_BATCH's when the
            # endpoint read failed): hand its messages back, unsent
            return ClaimBatch([], [], governed_count, unready=messages, error=exc)
        finally:
            if fences:
                self._refused(fences, accepted, on_refused)
        return ClaimBatch(messages, endpoints, governed_count)

    def _governed(self, rows: Sequence[Sequence[Any]]) -> int:
        """CLAIM_GOVERNED's ``governed``; the next governed claim starts after its
        (``gafter_bucket``, ``gafter``)."""
        self._gafter = (rows[0][-3], rows[0][-2])
        return int(rows[0][-4])

    def _cursor(self, buckets: Sequence[int] | None) -> tuple[int, int]:
        """Where the claim's walk goes on: after the last endpoint a claim took from, if
        its bucket is still the claim's (the walk goes into no bucket it was not given
        but the cursor's own); else from the first bucket."""
        after = self._after
        if buckets is not None and after[0] not in buckets:
            return NO_BUCKET, LEAST_ID
        return after

    def _in_turn(self, rows: Sequence[Sequence[Any]]) -> list[ClaimedMessage]:
        """CLAIM_BATCH's messages (the row of NULLs of an empty claim dropped), in the
        order it took their endpoints; the next claim starts after the last one."""
        claimed = [ClaimedMessage(*row[:-1]) for row in rows if row[0] is not None]
        if self._resume is not None:  # a claim from a NOTIFY's bucket: the turn stays
            self._after, self._resume = self._resume, None
        elif claimed:
            self._after = (claimed[-1].bucket, claimed[-1].endpoint_id)
        return claimed

    def _buckets_literal(self, buckets: Sequence[int] | None) -> str:
        """:func:`buckets_literal`, kept for the last bucket sets asked for (a claim's scope
        changes only when leadership does)."""
        if buckets is None:
            return ALL_BUCKETS_LITERAL
        key = tuple(buckets)
        literal = self._literals.get(key)
        if literal is None:
            if len(self._literals) >= 64:
                self._literals.clear()
            literal = self._literals[key] = buckets_literal(key)
        return literal

    def _refused(
        self,
        fences: Mapping[int, int],
        accepted: Collection[int],
        on_refused: Callable[[list[int]], None] | None,
    ) -> list[int]:
        refused = sorted(set(fences) - set(accepted))
        if refused:
            self.stale_leader_claims += len(refused)
            if on_refused is not None:
                on_refused(refused)
        return refused

    async def _claim_in_transaction(
        self,
        limit: int,
        params: dict[str, Any],
        fences: Mapping[int, int] | None,
        buckets: Sequence[int] | None,
        shards: int,
        on_refused: Callable[[list[int]], None] | None,
        endpoint_versions: Mapping[int, datetime] | None,
        governed: bool,
    ) -> ClaimBatch:
        """The fences, the governed claim, the plain one and the endpoints the messages
        need, in one transaction (rolled back whole if any part fails)."""
        async with self.engine.begin() as conn:
            if fences:
                offered = {"fences": _fences_json(fences), "holder": self.poller_id}
                accepted = {row.shard for row in await fetch(conn, queries.FENCE_SHARDS, offered)}
                self._refused(fences, accepted, on_refused)
                allowed = [b for b in (buckets or ALL_BUCKETS) if b % shards in accepted]
                if not allowed:
                    return ClaimBatch([], [])
                params["buckets"] = buckets_literal(allowed)
                params["after_bucket"], params["after"] = self._cursor(allowed)
            messages: list[ClaimedMessage] = []
            governed_count = None
            if governed:
                found = await fetch(conn, queries.CLAIM_GOVERNED, params, columns=_GOVERNED_FIELDS)
                if (spend := _spend(found)) is not None:
                    await fetch(conn, queries.SPEND_TOKENS, spend)
                governed_count = self._governed(found)
                messages = [ClaimedMessage(*row[:-5]) for row in found if row[0] is not None]
                params["limit"] = limit - len(messages)
            if limit > len(messages):
                claimed = await fetch(conn, queries.CLAIM_BATCH, params, columns=_FENCED_FIELDS)
                messages += self._in_turn(claimed)
            stale = _stale_endpoints(messages, endpoint_versions or {})
            endpoints = []
            if stale:
                rows = await conn.execute(queries.ENDPOINTS_BY_ID, {"ids": stale})
                endpoints = [Endpoint.from_row(row, self.keyring) for row in rows]
        return ClaimBatch(messages, endpoints, governed_count)

    async def close(self) -> None:
        """Close the connections the claims and completions go through (the engine stays
        the caller's)."""
        await self.direct.close()
        await self.completions.close()

    async def extend(self, held: Mapping[int, int]) -> Extended:
        """Extend the claim lease of held rows ({id: claim_token}).

        One statement for all of them, fenced by claim token: a row that was
        reclaimed (and maybe claimed again), or deleted, is neither extended nor
        returned. A row someone else holds locked is not waited for: it comes back
        in ``busy`` (still this claim's, not extended this time).
        """
        if not held:
            return Extended(set(), set())
        params = {
            "ids": list(held),
            "tokens": list(held.values()),
            "claim_lease": self.claim_lease,
        }
        async with self.engine.begin() as conn:
            rows = await fetch(conn, queries.EXTEND_CLAIMS, params)
        extended = {row[0] for row in rows if row[1]}
        return Extended(extended, {row[0] for row in rows if not row[1]})

    async def complete(self, outcomes: Sequence[Outcome]) -> CompletionResult:
        """Apply outcomes of this poller's claims: :meth:`Completions.complete
        <poller.rows.completions.Completions.complete>`."""
        return await self.completions.complete(outcomes)
