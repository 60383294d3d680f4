"""Idempotent creates for the management API: a request sent again with the same
``Idempotency-Key`` (a client that lost the answer and retried) answers as the first
did instead of making a second endpoint.

A key is the caller's own (two tokens may use one key) and kept for
:data:`KEPT` (a day, as Stripe and Svix keep theirs). It is written in the
transaction that makes the thing, so a request that failed left no key, and two
requests with one key at once are one: the second waits on the first's row, then
finds it. The same key with a different body is :class:`RequestConflict`: the
client reused a key, and neither answer would be right.

"""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta
from typing import Any

from sqlalchemy import Connection

from poller.errors import InvalidInput, RequestConflict
from poller.store import queries

KEPT = timedelta(days=1)
MAX_KEY = 255


def digest(body: Any) -> str:
    """The request's fingerprint: its JSON in one canonical form."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()


def claim(conn: Connection, caller: str, key: str, body: Any, made: str) -> str | None:
    """Take ``key`` for a request that makes ``made``: None, the request is new (go on
    and make it, in this transaction); else the name the first such request made."""
    if not key or len(key) > MAX_KEY or not key.isprintable():
        raise InvalidInput(f"Idempotency-Key: 1 to {MAX_KEY} printable characters")
    conn.execute(queries.FORGET_REQUESTS, {"kept": KEPT.total_seconds()})
    fingerprint = digest(body)
    mine = {"caller": caller, "idempotency_key": key}
    taken = conn.execute(
        queries.TAKE_REQUEST, {**mine, "request_sha256": fingerprint, "made": made}
    ).first()
    if taken is not None:
        return None
    first = conn.execute(queries.REQUEST_TAKEN, mine).one()
    if first.request_sha256 != fingerprint:
        raise RequestConflict(f"Idempotency-Key {key[:60]!r} was used for a different request")
    return str(first.made)
