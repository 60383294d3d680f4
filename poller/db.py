"""Database URLs and engines.

Users write ordinary ``postgresql://`` URLs; SQLAlchemy needs the driver named
(``postgresql+psycopg://``). When no URL is configured, the embedded server
under ``POLLER_DATA_DIR`` is started (or found running) and used.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, create_engine
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from poller.errors import ConfigurationError
from poller.settings import Settings

_SCHEMES = {"postgres", "postgresql", "postgresql+psycopg", "postgresql+psycopg_async"}


def sqlalchemy_url(url: str) -> str:
    """``postgresql://…`` → ``postgresql+psycopg://…``; refuse anything not PostgreSQL."""
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise ConfigurationError(f"POLLER_DATABASE_URL: not a database URL ({exc})") from None
    if parsed.drivername not in _SCHEMES:
        raise ConfigurationError(
            f"POLLER_DATABASE_URL: must be a postgresql:// URL (got scheme {parsed.drivername!r})"
        )
    return parsed.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)


def libpq_url(url: str) -> str:
    """The plain libpq form of a URL, for psycopg.connect()."""
    return sqlalchemy_url(url).replace("postgresql+psycopg://", "postgresql://", 1)


def database_url(settings: Settings) -> str:
    """The configured URL, or the embedded server's (started on demand)."""
    if settings.database_url:
        return settings.database_url
    from poller.embedded import EmbeddedPostgres

    return EmbeddedPostgres(settings.data_dir).start()


def sync_engine(url: str, **kwargs: Any) -> Engine:
    """Engine for the CLI and admin paths (pre-ping: a stale pooled connection is replaced)."""
    kwargs.setdefault("pool_pre_ping", True)
    return create_engine(sqlalchemy_url(url), **kwargs)


def async_engine(url: str, **kwargs: Any) -> AsyncEngine:
    """The poller's engine. No pre-ping: it would cost a round trip per transaction on the
    hot path; the service retries a transaction that meets a dropped connection instead."""
    kwargs.setdefault("pool_pre_ping", False)
    return create_async_engine(sqlalchemy_url(url), **kwargs)
