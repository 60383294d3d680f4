"""The registry every statement module adds to (``STATEMENTS``: name → SQL).

Each statement is a :class:`Statement`: SQLAlchemy ``text()`` for
``conn.execute``, carrying its name and its text for psycopg (``:name`` →
``%(name)s``), which the claim path sends to the driver directly
(poller/db.py ``fetch``). Code passes the object (``queries.CLAIM_BATCH``),
never its name, so a typo is an error mypy and the import see."""

from __future__ import annotations

import re

from sqlalchemy import TextClause

STATEMENTS: dict[str, str] = {}
_PARAM = re.compile(r"(?<![:\w]):(\w+)")


def psycopg_sql(sql: str) -> str:
    """``sql`` in psycopg's paramstyle: ``%`` doubled, ``:name`` as ``%(name)s`` (statements
    use ``CAST``, never ``::``, and no colon in a literal: tests/integration/test_queries.py
    checks every statement's parameters come out the same)."""
    return _PARAM.sub(r"%(\1)s", sql.replace("%", "%%"))


class Statement(TextClause):
    """A named, registered statement: ``text(sql)`` with its ``name`` and its ``psycopg``
    text."""

    inherit_cache = True

    def __init__(self, name: str, sql: str) -> None:
        super().__init__(sql)
        self.name = name
        self.psycopg = psycopg_sql(sql)


def statement(name: str, sql: str) -> Statement:
    """Register ``sql`` under ``name`` (tests run each one) and return it."""
    if name in STATEMENTS:
        raise ValueError(f"two statements are called {name}")
    STATEMENTS[name] = sql
    return Statement(name, sql)
