"""The statements' psycopg text (poller/store/queries/_registry.py): compact, and short enough on
the hot path for psycopg to parse once."""

from __future__ import annotations

import pytest
from psycopg import _queries

from poller.store import queries
from poller.store.queries._registry import compact


@pytest.mark.parametrize(
    ("sql", "compacted"),
    [
        ("SELECT  a ,\n  b  -- the endpoint's tokens\nFROM t", "SELECT a,b FROM t"),
        ("WHERE x = 'a  -- b' AND y = 'it''s'", "WHERE x = 'a  -- b' AND y = 'it''s'"),
        ('SELECT "odd  name" , f( x )\n-- last', 'SELECT "odd  name",f(x)'),
        ("SELECT a -\n- b", "SELECT a - - b"),  # two minus signs, not a comment
        ("SELECT 'unclosed  x", "SELECT 'unclosed  x"),
    ],
)
def test_compact_drops_comments_and_spaces_but_not_literals(sql: str, compacted: str) -> None:
    assert compact(sql) == compacted


@pytest.mark.parametrize("statement", [queries.CLAIM_BATCH, queries.COMPLETE_BATCH])
def test_the_hot_statements_stay_short_enough_for_psycopg_to_cache(statement: object) -> None:
    """psycopg parses a statement over this length on every execution (30 µs a claim)."""
    assert len(statement.psycopg.encode()) <= _queries.MAX_CACHED_STATEMENT_LENGTH  # type: ignore[attr-defined]
