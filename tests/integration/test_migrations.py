"""The migrations and the SQLAlchemy models agree, and migrate both ways."""

from __future__ import annotations

from typing import Any

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect

from poller.store import (
    migrate,
    schema_api,  # noqa: F401  (its tables, on the same metadata)
    schema_election,  # noqa: F401  (its tables, on the same metadata)
)
from poller.store.db import sync_engine
from poller.store.schema import metadata


def test_autogenerate_finds_no_difference(db_url: str) -> None:
    engine = sync_engine(db_url)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(
                conn,
                opts={
                    "version_table": migrate.VERSION_TABLE,
                    "compare_type": True,
                    "include_object": lambda obj, name, type_, *_: (
                        type_ != "table" or name.startswith("poller_")
                    ),
                },
            )
            assert compare_metadata(context, metadata) == []
    finally:
        engine.dispose()


def test_the_revision_the_code_needs_is_the_scripts_head() -> None:
    assert migrate.scripts_head() == migrate.HEAD, "a new migration: set poller.store.migrate.HEAD"
    assert migrate.revisions()[-1] == migrate.HEAD


def test_upgrade_downgrade_upgrade_on_an_empty_database(empty_db_url: str) -> None:
    assert migrate.current_revision(empty_db_url) is None
    migrate.upgrade(empty_db_url)
    assert migrate.current_revision(empty_db_url) == migrate.head_revision()
    from alembic import command

    command.downgrade(migrate.alembic_config(empty_db_url), "base")
    engine = sync_engine(empty_db_url)
    try:
        assert [t for t in inspect(engine).get_table_names() if t != migrate.VERSION_TABLE] == []
    finally:
        engine.dispose()
    migrate.upgrade(empty_db_url)
    migrate.upgrade(empty_db_url)  # idempotent
    assert migrate.current_revision(empty_db_url) == migrate.head_revision()


def test_version_table_leaves_the_applications_alembic_alone(empty_db_url: str) -> None:
    migrate.upgrade(empty_db_url)
    engine = sync_engine(empty_db_url)
    try:
        tables = set(inspect(engine).get_table_names())
    finally:
        engine.dispose()
    assert "alembic_version" not in tables
    assert {"poller_alembic_version", "poller_outbox", "poller_endpoints"} <= tables


def _endpoint_as_then(conn: Any, name: str) -> None:
    """An endpoint made at an older revision: the columns every revision has (the code's
    insert names the newest ones)."""
    from sqlalchemy import text

    from poller.endpoints.registry import bucket_for, new_secret

    conn.execute(
        text("INSERT INTO poller_endpoints (name, url, secret, bucket) VALUES (:n, :u, :s, :b)"),
        {"n": name, "u": "https://example.com/hook", "s": new_secret(), "b": bucket_for(name)},
    )


def test_0022_raises_a_stored_rate_limit_to_the_floor(empty_db_url: str) -> None:
    """A rate the old check took (5e-324) failed every governed claim: the upgrade
    raises it to the floor, and the new check refuses it."""
    from sqlalchemy import text

    from poller.rules.health import MIN_RATE

    migrate.upgrade(empty_db_url, "0021")
    engine = sync_engine(empty_db_url)
    try:
        with engine.begin() as conn:
            _endpoint_as_then(conn, "billing")
            conn.execute(text("UPDATE poller_endpoints SET rate_limit = 5e-324"))
        migrate.upgrade(empty_db_url)
        with engine.connect() as conn:
            stored = conn.execute(text("SELECT rate_limit FROM poller_endpoints")).scalar_one()
        assert stored == MIN_RATE
    finally:
        engine.dispose()


def test_0025_gives_every_health_row_its_endpoints_bucket(empty_db_url: str) -> None:
    """The governed claim walks the circuits not closed by bucket: the upgrade writes
    each existing health row's bucket; an endpoint made after has its own, one whose
    bucket plain SQL changed has the new one, and a row made by hand, naming no
    bucket, its endpoint's."""
    from sqlalchemy import text

    from poller.endpoints.registry import create_endpoint

    buckets = text(
        "SELECT e.name, e.bucket, h.bucket FROM poller_endpoints e"
        " JOIN poller_endpoint_health h ON h.endpoint_id = e.id ORDER BY e.name"
    )
    migrate.upgrade(empty_db_url, "0024")
    engine = sync_engine(empty_db_url)
    try:
        with engine.begin() as conn:
            for name in ("billing", "crm"):
                _endpoint_as_then(conn, name)
        migrate.upgrade(empty_db_url)
        with engine.begin() as conn:
            create_endpoint(conn, "orders", "https://example.com/hook")
            conn.execute(text("UPDATE poller_endpoints SET bucket = 7 WHERE name = 'crm'"))
            billing = "(SELECT id FROM poller_endpoints WHERE name = 'billing')"
            conn.execute(text(f"DELETE FROM poller_endpoint_health WHERE endpoint_id = {billing}"))
            conn.execute(text(f"INSERT INTO poller_endpoint_health (endpoint_id) SELECT {billing}"))
            rows = conn.execute(buckets).all()
        assert [name for name, _, _ in rows] == ["billing", "crm", "orders"]
        assert all(ours == theirs for _, ours, theirs in rows), rows
        assert rows[1][1] == 7
    finally:
        engine.dispose()
