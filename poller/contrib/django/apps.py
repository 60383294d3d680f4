"""The Django app: ``manage.py check`` warns while the poller's tables are missing or
behind this package's migrations (``manage.py migrate`` creates them: migrations/)."""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.core import checks


class PollerConfig(AppConfig):  # type: ignore[misc]
    name = "poller.contrib.django"
    label = "poller"
    verbose_name = "webhook-poller"

    def ready(self) -> None:
        # Not tagged "database": Django runs those only with --database, and a plain
        # `manage.py check` is where a new project looks.
        checks.register(tables_migrated)


def tables_migrated(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """A warning per PostgreSQL database whose poller tables are missing or behind: the
    default database, or those named (``manage.py check --database …``, ``migrate``).
    A database that cannot be reached is Django's to report; named, it is said here too."""
    from django.db import DEFAULT_DB_ALIAS, connections

    from poller.store.migrate import HEAD, VERSION_TABLE

    found: list[checks.CheckMessage] = []
    for alias in databases or (DEFAULT_DB_ALIAS,):
        conn = connections[alias]
        if conn.vendor != "postgresql":
            continue
        try:
            with conn.cursor() as cursor:
                cursor.execute("SELECT to_regclass(%s)", [VERSION_TABLE])
                current = None
                if cursor.fetchone()[0] is not None:
                    cursor.execute(f"SELECT version_num FROM {VERSION_TABLE}")
                    row = cursor.fetchone()
                    current = row[0] if row else None
        except Exception as exc:  # an unreachable database is Django's own error to give
            if databases is None:  # e.g. makemigrations on a machine with no database
                continue
            found.append(
                checks.Warning(
                    f"could not read the poller's schema version in {alias!r}: {exc}",
                    id="poller.W002",
                )
            )
            continue
        if current is None or (current.isdigit() and int(current) < int(HEAD)):
            state = "missing" if current is None else f"at {current}, this version needs {HEAD}"
            found.append(
                checks.Warning(
                    f"the poller's tables in database {alias!r} are {state}",
                    hint=f"run `python manage.py migrate poller --database {alias}` "
                    "(or `poller db upgrade`)",
                    id="poller.W001",
                )
            )
    return found
