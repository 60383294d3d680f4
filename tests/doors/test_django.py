"""poller.contrib.django beyond the conformance suite: a new project's ``check`` and
``migrate`` on both of Django's PostgreSQL drivers, a database that is not PostgreSQL,
and the app's migrations keeping up with the poller's."""

from __future__ import annotations

import importlib
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

from poller.errors import ConnectionNotSupported
from poller.store import migrate

APP = Path(__file__).with_name("django_app.py")


@pytest.mark.parametrize("driver", ["psycopg", "psycopg2"])
def test_check_warns_migrate_makes_the_tables_and_atomic_holds(
    empty_db_url: str, driver: str
) -> None:
    done = subprocess.run(
        [sys.executable, str(APP), empty_db_url, driver],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    said = json.loads(done.stdout.splitlines()[-1])
    assert said["driver"].partition(".")[0] == driver
    assert "poller.W001" in said["before"] and "are missing" in said["before"]
    assert "manage.py migrate poller" in said["before"]
    assert "poller.W001" not in said["after"]
    assert said["rows"] == [[said["kept"], "kept"]]


def test_a_database_that_is_not_postgresql_is_refused_by_name() -> None:
    from poller.contrib import django as outbox

    with pytest.raises(ConnectionNotSupported, match="'lite' is sqlite"):
        outbox.enqueue(using="lite", endpoint="billing", event_type="a.b", payload={},
                       idempotency_key="k")  # fmt: skip


def test_the_apps_newest_migration_brings_the_poller_to_its_head() -> None:
    """A new Alembic revision needs a Django migration that runs it (migrations/)."""
    package = importlib.import_module("poller.contrib.django.migrations")
    newest = max(m.name for m in pkgutil.iter_modules(package.__path__))
    module = importlib.import_module(f"{package.__name__}.{newest}")
    assert module.POLLER_REVISION == migrate.HEAD
