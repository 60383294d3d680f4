"""Alembic environment: migrates poller's tables (poller/store/schema.py's metadata)."""

from __future__ import annotations

from alembic import context

from poller.settings import load_settings
from poller.store import schema_api, schema_election  # noqa: F401  (their tables, on the metadata)
from poller.store.db import sqlalchemy_url, sync_engine
from poller.store.migrate import VERSION_TABLE
from poller.store.schema import metadata

config = context.config


def _url() -> str:
    url = config.get_main_option("sqlalchemy.url")
    if url:
        return url
    from poller.store.db import database_url

    return sqlalchemy_url(database_url(load_settings()))


def _include_object(obj, name, type_, reflected, compare_to):  # type: ignore[no-untyped-def]
    # Share a database with the application: only look at poller's own tables.
    if type_ == "table":
        return bool(name and name.startswith("poller_"))
    return True


def run_migrations_offline() -> None:
    context.configure(
        url=_url(),
        target_metadata=metadata,
        version_table=VERSION_TABLE,
        literal_binds=True,
        include_object=_include_object,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    engine = sync_engine(_url())
    try:
        with engine.connect() as connection:
            context.configure(
                connection=connection,
                target_metadata=metadata,
                version_table=VERSION_TABLE,
                include_object=_include_object,
                compare_type=True,
            )
            with context.begin_transaction():
                context.run_migrations()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
