"""Fixtures of the doors' conformance suite: ``door`` is each door in turn, writing into
a database of its own (a clone of the template, or Django's test database)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from tests.doors.doors import ALL, Door, available

POLLER_TABLES = (
    "poller_delivery_attempts, poller_outbox, poller_events, poller_ordering_keys, "
    "poller_spent_keys, poller_endpoints"
)


@pytest.fixture(scope="session")
def django_db_modify_db_settings(
    django_db_modify_db_settings_parallel_suffix: None, pg_admin_url: str
) -> None:
    """Django's test databases on the suite's PostgreSQL server."""
    from django.conf import settings

    url = make_url(pg_admin_url)
    settings.DATABASES["default"].update(
        HOST=url.host or "127.0.0.1", PORT=str(url.port or 5432),
        USER=url.username or "postgres", PASSWORD=url.password or "",
    )  # fmt: skip


def django_url() -> str:
    from django.db import connection

    from poller.contrib.django.schema import database_url

    return database_url(connection.settings_dict)


@pytest.fixture(params=ALL)
def door(request: pytest.FixtureRequest) -> Iterator[Door]:
    if (why := available(request.param)) is not None:
        pytest.skip(why)
    if request.param != "django":
        yield Door(request.param, request.getfixturevalue("db_url"))
        return
    # Django's test database, migrated (so by the app's migration, which runs the
    # poller's), each test in a TransactionTestCase: its writes commit.
    request.applymarker(pytest.mark.django_db(transaction=True))
    request.getfixturevalue("_django_db_helper")
    url = django_url()
    from poller.store.db import sync_engine

    engine = sync_engine(url)
    with engine.begin() as conn:  # Django flushes its own tables only
        conn.execute(text(f"TRUNCATE {POLLER_TABLES} CASCADE"))
    engine.dispose()
    yield Door("django", url)


@pytest.fixture
def door_engine(door: Door) -> Iterator[Any]:
    from poller.store.db import sync_engine

    engine = sync_engine(door.db_url)
    yield engine
    engine.dispose()
