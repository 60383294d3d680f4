"""Django: enqueue and publish inside ``transaction.atomic()``, on Django's connection.

Add ``"poller.contrib.django"`` to ``INSTALLED_APPS``; ``manage.py migrate`` then
creates (or updates) the poller's tables in each database it migrates — the same
Alembic scripts ``poller db upgrade`` runs — and ``manage.py check`` warns while they
are missing or behind. In a view::

    from django.db import transaction
    from poller.contrib import django as outbox

    with transaction.atomic():
        order = Order.objects.create(total=42)
        outbox.enqueue(endpoint="billing", event_type="order.created",
                       payload={"id": order.id}, idempotency_key=f"order:{order.id}")

The write runs on the connection of ``using`` (a database alias, as Django's own
``using=``; the default database if none), inside whatever ``atomic()`` block is open
on it: it commits with the order or not at all. Outside any block, Django's
autocommit commits it at once — as it would the order. Django's PostgreSQL backend on
psycopg 3 and on psycopg2 both work; the errors are :mod:`poller.errors`' as on every
door.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from poller.errors import ConnectionNotSupported
from poller.outbox.enqueue import Message
from poller.outbox.enqueue import enqueue as _enqueue
from poller.outbox.enqueue import enqueue_many as _enqueue_many
from poller.outbox.publish import Event, Published
from poller.outbox.publish import publish as _publish
from poller.outbox.publish import publish_many as _publish_many
from poller.rules.payloads import JsonDefault

__all__ = ["enqueue", "enqueue_many", "publish", "publish_many"]


def connection(using: str | None = None) -> Any:
    """Django's connection of the database alias ``using`` (the default one if None),
    which must be PostgreSQL."""
    from django.db import DEFAULT_DB_ALIAS, connections

    conn = connections[using or DEFAULT_DB_ALIAS]
    if conn.vendor != "postgresql":
        raise ConnectionNotSupported(
            f"database {conn.alias!r} is {conn.vendor}: the outbox lives in PostgreSQL"
        )
    return conn


def enqueue(*, using: str | None = None, **fields: Any) -> int:
    """:func:`poller.enqueue` on Django's connection ``using``: the message's id."""
    return _enqueue(connection(using), **fields)


def enqueue_many(
    messages: Iterable[Message],
    *,
    using: str | None = None,
    json_default: JsonDefault | None = None,
) -> list[int]:
    """:func:`poller.enqueue_many` on Django's connection ``using``."""
    return _enqueue_many(connection(using), messages, json_default=json_default)


def publish(*, using: str | None = None, **fields: Any) -> Published:
    """:func:`poller.publish` on Django's connection ``using``."""
    return _publish(connection(using), **fields)


def publish_many(
    events: Iterable[Event], *, using: str | None = None, json_default: JsonDefault | None = None
) -> list[Published]:
    """:func:`poller.publish_many` on Django's connection ``using``."""
    return _publish_many(connection(using), events, json_default=json_default)
