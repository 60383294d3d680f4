"""Helpers shared by the command modules (light to import: poller/cli/lazy.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from poller.settings import Settings


def settings_and_url(*, create: bool = False) -> tuple[Settings, str]:
    """Validated settings and the database URL (the embedded server's when none is set;
    ``create``: make one if there is none)."""
    from poller.settings import load_settings
    from poller.store.db import database_url

    settings = load_settings()
    return settings, database_url(settings, create=create)


def where(settings: Settings, url: str) -> str:
    """Which database is in use, for people: the URL without its password, or the folder."""
    if settings.database_url:
        from sqlalchemy.engine import make_url

        parsed = make_url(url)  # libpq also takes a password in the query string
        hidden = {k: "***" for k in parsed.query if k.lower() in ("password", "sslpassword")}
        shown = parsed.update_query_dict(hidden).render_as_string(hide_password=True)
        return shown.replace("%2A%2A%2A", "***")
    from poller.local.embedded import default_data_dir

    return f"embedded PostgreSQL in {default_data_dir(settings.data_dir)}"


def command_engine() -> Engine:
    """A sync engine for this command, disposed when the command ends.

    The schema must be at the newest revision: a command on an unmigrated
    database says so in one line instead of failing on a missing table.
    """
    from poller.store.db import sync_engine
    from poller.store.migrate import require_schema

    _, url = settings_and_url()
    engine = sync_engine(url)
    click.get_current_context().call_on_close(engine.dispose)
    require_schema(engine)
    return engine
