"""The poller's tables in a database Django knows: its connection settings as a URL
for Alembic (poller/store/migrate.py), which migrates on a connection of its own."""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import URL

# libpq parameters Django's OPTIONS may carry that mean something to a new connection
# (Django's own keys — isolation_level, pool, server_side_binding… — do not).
LIBPQ_OPTIONS = frozenset({
    "sslmode", "sslrootcert", "sslcert", "sslkey", "sslpassword", "sslcrl", "passfile",
    "service", "connect_timeout", "application_name", "options", "target_session_attrs",
    "channel_binding", "gssencmode", "krbsrvname", "sslnegotiation", "sslsni",
})  # fmt: skip


def database_url(settings: dict[str, Any]) -> str:
    """A Django database's settings (``connection.settings_dict``) as a URL the poller's
    migrations connect with, password included."""
    query = {k: str(v) for k, v in (settings.get("OPTIONS") or {}).items() if k in LIBPQ_OPTIONS}
    host = settings.get("HOST") or None
    if host and host.startswith("/"):  # a socket directory: libpq's host parameter
        query["host"], host = host, None
    url = URL.create(
        "postgresql+psycopg",
        username=settings.get("USER") or None,
        password=settings.get("PASSWORD") or None,
        host=host,
        port=int(settings["PORT"]) if settings.get("PORT") else None,
        database=settings.get("NAME") or None,
        query=query,
    )
    return url.render_as_string(hide_password=False)


def upgrade_database(connection: Any) -> None:
    """Migrate the poller's tables in the database of a Django connection to the head."""
    from poller.store.migrate import upgrade

    upgrade(database_url(connection.settings_dict))
