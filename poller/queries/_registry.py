"""The registry every statement module adds to (``STATEMENTS``: name → SQL)."""

from __future__ import annotations

from sqlalchemy import TextClause, text

STATEMENTS: dict[str, str] = {}


def statement(name: str, sql: str) -> TextClause:
    """Register ``sql`` under ``name`` (tests run each one) and return it as text()."""
    if name in STATEMENTS:
        raise ValueError(f"two statements are called {name}")
    STATEMENTS[name] = sql
    return text(sql)
