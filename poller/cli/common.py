"""Helpers shared by the command modules."""

from __future__ import annotations

import click
from sqlalchemy import Engine

from poller.db import database_url, sync_engine
from poller.migrate import require_schema
from poller.settings import Settings, load_settings


def settings_and_url() -> tuple[Settings, str]:
    """Validated settings and the database URL (starting the embedded server if unset)."""
    settings = load_settings()
    return settings, database_url(settings)


def command_engine() -> Engine:
    """A sync engine for this command, disposed when the command ends.

    The schema must be at the newest revision: a command on an unmigrated
    database says so in one line instead of failing on a missing table.
    """
    _, url = settings_and_url()
    engine = sync_engine(url)
    click.get_current_context().call_on_close(engine.dispose)
    require_schema(engine)
    return engine
