"""Operator queries and actions behind ``poller admin`` (sync, SQLAlchemy Core).

What failed and why (:func:`list_failed`, :func:`message_detail`), how the
queue is doing (poller/operate/stats.py), sending again (:func:`retry_messages`)
and deleting history (:func:`purge`). Every action is one short transaction
per batch, so a large retry or purge never holds long locks; every manual
retry is recorded as an attempt of kind ``manual`` naming who asked.
"""

from __future__ import annotations

import getpass
import socket
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine

from poller.endpoints.checks import MAX_COUNT, could_be_name
from poller.errors import InvalidInput, MessageNotFound, UnknownEndpoint
from poller.rows.ordering import requeue_keyed
from poller.rules.names import could_be_event_type
from poller.rules.parse import ROW_ID_MAX, could_be_row_id
from poller.rules.payloads import stored_payload
from poller.settings import default_settings
from poller.store import queries
from poller.store.queries import admin as built
from poller.store.queries.admin import MESSAGE_FIELDS as MESSAGE_FIELDS
from poller.store.schema import STATUSES

RETRY_BATCH = 1000  # ids per statement of a retry


def actor() -> str:
    """Who is acting, for the attempt record: user@host."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"admin:{user}@{socket.gethostname()}"


def _endpoint_id(conn: Connection, name: str) -> int:
    if not could_be_name(name):
        raise UnknownEndpoint(name)
    found = conn.execute(queries.ENDPOINT_ID, {"name": name}).scalar()
    if found is None:
        raise UnknownEndpoint(name)
    return int(found)


# --- reading ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FailedFilter:
    """Which failed messages: the CLI's ``failed``/``retry --all-failed`` and the dashboard.

    ``error``: an HTTP status (``503``) matches the last status code; any other text
    is looked for in the last error, case-insensitively."""

    endpoint: str | None = None
    event_type: str | None = None
    error: str | None = None
    since: datetime | None = None
    until: datetime | None = None

    def where(self, conn: Connection) -> list[Any]:
        """The filter's clauses (poller/store/queries/admin.py failed_where)."""
        return built.failed_where(
            endpoint_id=None if self.endpoint is None else _endpoint_id(conn, self.endpoint),
            event_type=self.event_type,
            error=self.error,
            since=self.since,
            until=self.until,
            # a type no message can have (PostgreSQL refuses a NUL)
            possible=self.event_type is None or could_be_event_type(self.event_type),
        )


def list_failed(
    conn: Connection,
    *,
    endpoint: str | None = None,
    event_type: str | None = None,
    since: datetime | None = None,
    limit: int = 50,
    where: FailedFilter | None = None,
    before: tuple[datetime, int] | None = None,
) -> list[dict[str, Any]]:
    """Failed messages, newest failure first; ``before`` ((failed_at, id) of the last row
    of a page) gives the next page — a keyset, so page 1,000 costs what page 1 does."""
    _check_limit(limit)
    where = where or FailedFilter(endpoint, event_type, since=since)
    query = built.failed_page(where.where(conn), limit, before)
    return [dict(row._mapping) for row in conn.execute(query)]


def list_messages(
    conn: Connection,
    *,
    endpoint: str | None = None,
    status: str | None = None,
    event_type: str | None = None,
    tenant: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    before: int | None = None,
    limit: int = 100,
) -> list[dict[str, Any]]:
    """Messages, newest first (their :data:`MESSAGE_FIELDS` and their endpoint's name,
    never a payload); ``tenant``: only that tenant's endpoints' (None: any endpoint's);
    ``since``/``until``: created in that window; ``before``: the id of the last row of a
    page, for the next one (a keyset)."""
    if status is not None and status not in STATUSES:
        raise InvalidInput(f"status {status[:40]!r}: one of {', '.join(STATUSES)}")
    _check_limit(limit)
    if before is not None and before <= 1:  # no row has an id below 1
        return []
    if event_type is not None and not could_be_event_type(event_type):
        return []
    query = built.messages_page(
        endpoint_id=None if endpoint is None else _endpoint_id(conn, endpoint),
        status=status,
        event_type=event_type,
        tenant=tenant,
        since=since,
        until=until,
        before=before if before is not None and before <= ROW_ID_MAX else None,  # past it: all
        limit=limit,
    )
    return [dict(row._mapping) for row in conn.execute(query)]


def _check_limit(limit: int) -> None:
    if limit < 0:
        raise InvalidInput(f"limit {limit}: a number of rows, 0 or more")


def message_detail(
    conn: Connection,
    message_id: int | None = None,
    *,
    key: str | None = None,
    endpoint: str | None = None,
) -> dict[str, Any]:
    """The message (payload included) and every attempt, oldest first."""
    if message_id is not None:
        if not could_be_row_id(message_id):
            raise MessageNotFound(f"no message {message_id}")
        query = built.message(message_id)
    elif key is not None and endpoint is not None:
        query = built.message(endpoint_id=_endpoint_id(conn, endpoint), key=key)
    else:
        raise InvalidInput("give a message id, or --key with --endpoint")
    row = conn.execute(query).one_or_none()
    if row is None:
        ident = message_id if message_id is not None else f"{key!r} on {endpoint!r}"
        raise MessageNotFound(f"no message {ident}")
    attempts = conn.execute(built.attempts(row.id)).all()
    detail = dict(row._mapping)
    detail.pop("endpoint_id")
    if detail["payload"] is None and row.event_id is not None:  # a published event's row
        detail["payload"] = conn.execute(built.event_payload(row.event_id)).scalar()
    detail["payload"] = stored_payload(detail["payload"])
    detail["attempts_log"] = [dict(a._mapping) for a in attempts]
    return detail


# --- acting ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RetryPlan:
    ids: list[int]
    skipped: dict[int, str]  # id -> why it was left alone


def plan_retry(
    conn: Connection,
    ids: list[int] | None = None,
    *,
    all_failed: bool = False,
    endpoint: str | None = None,
    since: datetime | None = None,
    force: bool = False,
    where: FailedFilter | None = None,
) -> RetryPlan:
    """Which messages a retry would send again: failed and cancelled ones (delivered with
    ``force``)."""
    if ids:
        query = built.statuses([i for i in ids if could_be_row_id(i)])
    elif all_failed or where is not None:
        query = built.statuses(where=(where or FailedFilter(endpoint, since=since)).where(conn))
    else:
        return RetryPlan([], {})
    rows: dict[int, str] = {r.id: r.status for r in conn.execute(query)}
    allowed = {"failed", "cancelled", "delivered"} if force else {"failed", "cancelled"}
    skipped = {
        i: f"is {s}"
        + (
            ""
            if s == "delivered" and force
            else " (only failed messages; delivered ones with --force)"
            if s == "delivered"
            else ""
        )
        for i, s in rows.items()
        if s not in allowed
    }
    for missing in set(ids or ()) - set(rows):
        skipped[missing] = "not found"
    return RetryPlan([i for i, s in rows.items() if s in allowed], skipped)


def retry_messages(
    engine: Engine, ids: list[int], *, who: str | None = None, outcome: str = "manual_retry"
) -> int:
    """Back to pending now with a fresh attempt budget; a ``manual`` attempt records who
    (and ``outcome``: ``manual_retry``, or ``replayed`` for poller/operate/replay.py)."""
    who = who or actor()
    default = default_settings().max_attempts
    done = 0
    for start in range(0, len(ids), RETRY_BATCH):
        chunk = ids[start : start + RETRY_BATCH]
        with engine.begin() as conn:
            changed = conn.execute(built.retry(chunk, default, MAX_COUNT)).all()
            requeue_keyed(
                conn,
                [(r.id, r.endpoint_id, r.ordering_key) for r in changed if r.ordering_key],
            )
            if changed:
                conn.execute(
                    built.RECORD_ATTEMPTS,
                    [
                        {
                            "message_id": r.id,
                            "endpoint_id": r.endpoint_id,
                            "attempt": r.attempts,
                            "kind": "manual",
                            "poller_id": who,
                            "outcome": outcome,
                        }
                        for r in changed
                    ],
                )
                for bucket in {r.bucket for r in changed}:
                    conn.execute(built.wake(bucket))
            done += len(changed)
    return done


def purge_counts(
    conn: Connection, delivered_older: timedelta | None, failed_older: timedelta | None
) -> dict[str, int]:
    """How many rows a purge would delete."""
    counts = {}
    for status, older in (
        ("delivered", delivered_older),
        ("failed", failed_older),
        ("cancelled", failed_older),  # kept as long as failures
    ):
        if older is not None:
            counts[status] = conn.execute(built.ended_before(status, older)).scalar_one()
    return counts
