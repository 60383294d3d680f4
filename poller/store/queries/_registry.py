"""The registry every statement module adds to (``STATEMENTS``: name → SQL).

Each statement is a :class:`Statement`: SQLAlchemy ``text()`` for
``conn.execute``, carrying its name and its text for psycopg (``:name`` →
``%(name)s``), which the claim path sends to the driver directly
(poller/store/db.py ``fetch``). Code passes the object (``queries.CLAIM_BATCH``),
never its name, so a typo is an error mypy and the import see."""

from __future__ import annotations

import re

from sqlalchemy import TextClause

STATEMENTS: dict[str, str] = {}
_PARAM = re.compile(r"(?<![:\w]):(\w+)")


def psycopg_sql(sql: str) -> str:
    """``sql`` in psycopg's paramstyle: ``%`` doubled, ``:name`` as ``%(name)s`` (statements
    use ``CAST``, never ``::``, and no colon in a literal: tests/integration/test_queries.py
    checks every statement's parameters come out the same), :func:`compact`."""
    return _PARAM.sub(r"%(\1)s", compact(sql).replace("%", "%%"))


_TIGHT = frozenset("(),")  # no space needed on either side of these


def compact(sql: str) -> str:
    """``sql`` without its ``--`` comments and with no more whitespace than it needs,
    literals ('…') and quoted names ("…") untouched. psycopg parses a statement's text
    on every execution when it is over 4,096 bytes (it caches shorter ones): the
    claim's 5,140 bytes cost 30 µs a claim; compacted, 3,960."""
    out: list[str] = []
    space = False  # whitespace (or a comment) seen since the last character kept
    i, n = 0, len(sql)
    while i < n:
        char = sql[i]
        if char in "'\"":  # a literal or a quoted name, to its closing quote ('' and "" inside)
            end = i + 1
            while end < n and not (sql[end] == char and sql[end + 1 : end + 2] != char):
                end += 2 if sql[end] == char else 1
            token, i = sql[i : end + 1], end + 1
        elif sql.startswith("--", i):
            end = sql.find("\n", i)
            i = n if end < 0 else end
            space = True
            continue
        elif char.isspace():
            i, space = i + 1, True
            continue
        else:
            token, i = char, i + 1
        if space and out and out[-1][-1] not in _TIGHT and token[0] not in _TIGHT:
            out.append(" ")
        out.append(token)
        space = False
    return "".join(out)


def numbered_sql(sql: str) -> tuple[str, tuple[str, ...]]:
    """``sql`` with ``$1, $2 …`` for its parameters (asyncpg's style, PostgreSQL's own),
    and their names in that order: each name once, however often it is used."""
    names: dict[str, int] = {}

    def number(found: re.Match[str]) -> str:
        return f"${names.setdefault(found.group(1), len(names) + 1)}"

    return _PARAM.sub(number, compact(sql)), tuple(names)


class Statement(TextClause):
    """A named, registered statement: ``text(sql)`` with its ``name``, its ``psycopg``
    text, and its ``asyncpg`` text with the parameters' names in their ``$n`` order."""

    inherit_cache = True

    def __init__(self, name: str, sql: str) -> None:
        super().__init__(sql)
        self.name = name
        self.psycopg = psycopg_sql(sql)
        self.asyncpg, self.order = numbered_sql(sql)


def statement(name: str, sql: str) -> Statement:
    """Register ``sql`` under ``name`` (tests run each one) and return it."""
    if name in STATEMENTS:
        raise ValueError(f"two statements are called {name}")
    STATEMENTS[name] = sql
    return Statement(name, sql)
