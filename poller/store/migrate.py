"""Alembic, driven from Python so an installed wheel migrates on its own.

The scripts live in ``db/`` at the repository root (``alembic.ini`` points
there, for ``alembic`` commands during development); the wheel carries the same
folder as ``poller/_migrations``. The version table is
``poller_alembic_version`` so it never collides with the application's own
Alembic history in a shared database.

Alembic is imported only to migrate, or when the database is not at
:data:`HEAD`: a poller starting on a migrated database compares the version
table with that constant and never loads it (with mako and pygments behind it,
a tenth of a poller's start-up CPU). A test holds the constant to the scripts'
head, so a new migration cannot forget it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Engine
from sqlalchemy.exc import ProgrammingError
from sqlalchemy.ext.asyncio import AsyncEngine

from poller.errors import ConfigurationError
from poller.store.db import sqlalchemy_url, sync_engine

if TYPE_CHECKING:
    from alembic.config import Config

    from poller.settings import Settings

VERSION_TABLE = "poller_alembic_version"
HEAD = "0027"
"""The newest revision of the scripts, which this code needs (tests/integration/
test_migrations.py checks it against them)."""


def script_location() -> Path:
    """poller/_migrations in an installed wheel, else db/ in a source checkout."""
    package = Path(__file__).resolve().parents[1]  # poller/
    packaged = package / "_migrations"
    if (packaged / "env.py").exists():
        return packaged
    return package.parent / "db"


def alembic_config(url: str) -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(script_location()))
    config.set_main_option("sqlalchemy.url", sqlalchemy_url(url).replace("%", "%%"))
    config.attributes["poller_configured"] = True
    return config


def upgrade(target: str | Engine, revision: str = "head") -> None:
    """Migrate the database (a URL, or your app's SQLAlchemy ``Engine``) to ``revision``.

    Idempotent, so an app can call it at startup, and a test suite in a
    session fixture::

        from poller.store import migrate

        migrate.upgrade(engine)   # creates or updates the poller_* tables only
    """
    known = revisions()
    if revision not in ("head", "heads", *known):  # alembic asserts on some (``''``, ``head+5``)
        raise ConfigurationError(
            f"revision {revision[:40]!r}: not a revision of this package "
            f"(head, {known[0]}…{known[-1]})"
        )
    url = target if isinstance(target, str) else target.url.render_as_string(hide_password=False)
    current = current_revision(url)
    if newer_than_known(current):
        assert current is not None
        raise _newer_error(current)
    from alembic import command

    command.upgrade(alembic_config(url), revision)


DOOR_SETTINGS = ("max_payload_bytes", "max_attempts", "notify")
"""The settings the SQL doors read from the database (``poller.<name>``; poller_setting
in db/sql/0026_doors.sql), where the Python doors use the process's."""


def write_door_settings(url: str, settings: Settings) -> str | None:
    """Make the database's ``poller.*`` settings the process's, for the SQL doors
    (``ALTER DATABASE … SET``: sessions that start later see them). None when done;
    else why not (only the database's owner or a superuser may)."""
    import psycopg

    from poller.store.db import libpq_url

    values = {
        name: str(getattr(settings, name)).lower() if name == "notify" else
        str(getattr(settings, name))
        for name in DOOR_SETTINGS
    }  # fmt: skip
    try:
        with psycopg.connect(libpq_url(url), autocommit=True) as conn:
            database = conn.execute("SELECT current_database()").fetchone()[0]  # type: ignore[index]
            for name, value in values.items():
                conn.execute(
                    psycopg.sql.SQL("ALTER DATABASE {} SET {} = {}").format(
                        psycopg.sql.Identifier(database),
                        psycopg.sql.Identifier("poller", name),
                        psycopg.sql.Literal(value),
                    )
                )
    except psycopg.errors.InsufficientPrivilege as exc:
        return str(exc).splitlines()[0]
    return None


def revisions() -> list[str]:
    """This package's revisions, oldest first."""
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(alembic_config("postgresql://localhost/x"))
    return [r.revision for r in reversed(list(script.walk_revisions()))]


def head_revision() -> str:
    """The revision this code needs: :data:`HEAD`."""
    return HEAD


def scripts_head() -> str | None:
    """The head of the migration scripts, as Alembic reads them (what :data:`HEAD` must be)."""
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(
        alembic_config("postgresql://localhost/x")
    ).get_current_head()


def current_revision(url: str) -> str | None:
    """The revision the database is at; None when never migrated."""
    from alembic.runtime.migration import MigrationContext

    engine = sync_engine(url)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
            return context.get_current_revision()
    finally:
        engine.dispose()


def newer_than_known(current: str | None) -> bool:
    """A revision this package does not have: a newer webhook-poller migrated it."""
    return current is not None and current not in revisions()


def _newer_error(current: str) -> ConfigurationError:
    return ConfigurationError(
        f"database schema is at {current[:40]!r}, which this version of webhook-poller "
        f"does not know (its newest is {head_revision()}): a newer version migrated it; "
        "upgrade webhook-poller"
    )


def _schema_error(current: str | None) -> ConfigurationError | None:
    head = head_revision()
    if current == head:
        return None
    if newer_than_known(current):
        assert current is not None
        return _newer_error(current)
    return ConfigurationError(
        f"database schema is at {current or 'nothing'}, this version needs {head}: "
        "run `poller db upgrade`"
    )


def require_schema(engine: Engine) -> None:
    """Raise ConfigurationError unless the database is at the revision this code needs."""
    from poller.store import queries

    try:
        with engine.connect() as conn:
            current = conn.execute(queries.SCHEMA_REVISION).scalar()
    except ProgrammingError:  # no version table: never migrated
        current = None
    error = _schema_error(current)
    if error is not None:
        raise error


async def check_schema(engine: AsyncEngine) -> None:
    """Raise ConfigurationError unless the database is at the revision this code needs.

    Connection errors propagate as they are (the service waits them out).
    """
    from poller.store import queries

    try:
        async with engine.connect() as conn:
            current = (await conn.execute(queries.SCHEMA_REVISION)).scalar()
    except ProgrammingError:  # no version table: never migrated
        current = None
    error = _schema_error(current)
    if error is not None:
        raise error
