"""Helpers shared by the command modules."""

from __future__ import annotations

from poller.db import database_url
from poller.settings import Settings, load_settings


def settings_and_url() -> tuple[Settings, str]:
    """Validated settings and the database URL (starting the embedded server if unset)."""
    settings = load_settings()
    return settings, database_url(settings)
