"""A pytest plugin for applications that enqueue webhooks: assert what a test enqueued.

Installed with the package (entry point ``pytest11``), it provides the
``outbox`` fixture. It reads the real ``poller_outbox`` rows through *your*
test's database session — so it sees what the code under test enqueued even
when the test's transaction is never committed. Tell it which session by
overriding ``poller_db`` in your ``conftest.py``::

    @pytest.fixture
    def poller_db(db_session):          # your own Session or Connection fixture
        return db_session

    def test_paying_an_invoice_sends_a_webhook(client, outbox):
        client.post("/invoices/42/pay")
        outbox.assert_enqueued("invoice.paid", endpoint="billing",
                               payload_contains={"invoice": 42})

Any synchronous connection a door takes works: a psycopg or psycopg2 connection, or
Django's ``django.db.connection`` (with pytest-django's ``db`` fixture).
``outbox.messages()`` lists what was enqueued since the test began (each with
its endpoint, event type, parsed payload and key); ``assert_nothing_enqueued()``
checks the opposite. An event the code published (:func:`poller.publish`) shows as
one message per endpoint it reached, with the event's payload. Async tests pass
``AsyncSession.sync_session`` or use ``await conn.run_sync(...)`` around the asserts.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pytest

from poller.outbox.doors import Door
from poller.store import queries


@dataclass(frozen=True, slots=True)
class EnqueuedMessage:
    id: int
    endpoint: str
    event_type: str
    payload: Any
    idempotency_key: str


def contains(whole: Any, part: Any) -> bool:
    """JSON containment, like PostgreSQL's ``@>``: every key of ``part`` is in ``whole``
    with a contained value; lists contain each element of ``part`` somewhere."""
    if isinstance(part, Mapping):
        return isinstance(whole, Mapping) and all(
            k in whole and contains(whole[k], v) for k, v in part.items()
        )
    if isinstance(part, list):
        return isinstance(whole, list) and all(any(contains(w, p) for w in whole) for p in part)
    return bool(whole == part)


class Outbox:
    """What the code under test enqueued, read from the rows in the test's transaction."""

    def __init__(self, conn: Any) -> None:
        self.door = Door(conn)
        self._after = int(self.door.run(queries.LAST_MESSAGE_ID, {})[0][0])

    def messages(
        self, event_type: str | None = None, *, endpoint: str | None = None
    ) -> list[EnqueuedMessage]:
        rows = self.door.run(queries.ENQUEUED_AFTER, {"after": self._after})
        found = [EnqueuedMessage(int(r[0]), r[1], r[2], json.loads(r[3]), r[4]) for r in rows]
        return [
            m
            for m in found
            if (event_type is None or m.event_type == event_type)
            and (endpoint is None or m.endpoint == endpoint)
        ]

    def assert_enqueued(
        self,
        event_type: str,
        *,
        endpoint: str | None = None,
        payload_contains: Mapping[str, Any] | None = None,
        count: int | None = None,
    ) -> EnqueuedMessage:
        """The (first) matching message; AssertionError listing what was enqueued if none."""
        matching = [
            m
            for m in self.messages(event_type, endpoint=endpoint)
            if payload_contains is None or contains(m.payload, payload_contains)
        ]
        if not matching or (count is not None and len(matching) != count):
            wanted = f"{count if count is not None else 'a'} {event_type!r} message(s)"
            where = f" to {endpoint!r}" if endpoint else ""
            shape = f" containing {dict(payload_contains)!r}" if payload_contains else ""
            seen = "\n".join(
                f"  {m.endpoint} {m.event_type} {m.idempotency_key} {m.payload!r}"
                for m in self.messages()
            )
            raise AssertionError(
                f"expected {wanted}{where}{shape}; found {len(matching)}. "
                f"Enqueued in this test:\n{seen or '  nothing'}"
            )
        return matching[0]

    def assert_nothing_enqueued(self) -> None:
        found = self.messages()
        if found:
            raise AssertionError(f"expected nothing enqueued, found {len(found)}: {found[:5]}")


@pytest.fixture
def poller_db() -> Iterator[Any]:
    """Override in your conftest.py: return the connection your test uses (a SQLAlchemy
    Session or Connection, a psycopg or psycopg2 connection, Django's ``connection``)."""
    raise pytest.UsageError(
        "the outbox fixture needs your test's database session: define a `poller_db` fixture "
        "returning it (see poller.testing)"
    )
    yield  # pragma: no cover


@pytest.fixture
def outbox(poller_db: Any) -> Outbox:
    """Assert what the code under test enqueued (see poller.testing)."""
    return Outbox(poller_db)
