"""The registry every statement module adds to (``STATEMENTS``: name → SQL), and each
statement's text for psycopg (``PSYCOPG``: ``:name`` → ``%(name)s``), which the claim
path sends to the driver directly (poller/db.py ``fetch``)."""

from __future__ import annotations

import re

from sqlalchemy import TextClause, text

STATEMENTS: dict[str, str] = {}
PSYCOPG: dict[str, str] = {}
_PARAM = re.compile(r"(?<![:\w]):(\w+)")


def psycopg_sql(sql: str) -> str:
    """``sql`` in psycopg's paramstyle: ``%`` doubled, ``:name`` as ``%(name)s`` (statements
    use ``CAST``, never ``::``, and no colon in a literal: tests/integration/test_queries.py
    checks every statement's parameters come out the same)."""
    return _PARAM.sub(r"%(\1)s", sql.replace("%", "%%"))


def statement(name: str, sql: str) -> TextClause:
    """Register ``sql`` under ``name`` (tests run each one) and return it as text()."""
    if name in STATEMENTS:
        raise ValueError(f"two statements are called {name}")
    STATEMENTS[name] = sql
    PSYCOPG[name] = psycopg_sql(sql)
    return text(sql)
