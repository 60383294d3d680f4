"""Text from outside reaches terminals escaped (poller/observe/logs.py, poller/cli/output.py)."""

from __future__ import annotations

import json
import logging
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from poller.observe.logs import ConsoleFormatter, JsonFormatter, printable, printable_json

HOSTILE = "\x1b]52;c;aGk=\x07 \x1b[2J \x9b \u202e \ud800 \U000e0041 é 漢\nnext"


def _acts_on_a_terminal(text: str, keep: str = "") -> bool:
    return any(not c.isprintable() and c not in keep for c in text)


@given(st.text())
def test_printable_leaves_nothing_a_terminal_acts_on(text: str) -> None:
    shown = printable(text)
    assert not _acts_on_a_terminal(shown)
    if text.isprintable():
        assert shown == text  # é, 漢 and the like are left alone


@given(st.recursive(st.none() | st.text() | st.integers(), lambda c: st.lists(c, max_size=3)))
def test_printable_json_is_the_same_json_and_safe(document: object) -> None:
    shown = printable_json({"v": document}, indent=2)
    assert json.loads(shown) == {"v": document}
    assert not _acts_on_a_terminal(shown, keep="\n")


def test_log_lines_cannot_be_forged_or_drive_a_terminal() -> None:
    try:
        raise ValueError(HOSTILE)
    except ValueError:
        error = sys.exc_info()
    record = logging.LogRecord("poller", logging.WARNING, "", 0, "answer: %s", (HOSTILE,), error)
    console = ConsoleFormatter("%(levelname)s %(message)s").format(record)
    first, *rest = console.split("\n")
    assert first == "WARNING answer: " + printable(HOSTILE)  # one line, escaped
    assert rest[0] == "Traceback (most recent call last):"
    assert not _acts_on_a_terminal(console, keep="\n")
    line = JsonFormatter().format(record)
    assert "\n" not in line and not _acts_on_a_terminal(line)
    assert json.loads(line)["message"] == f"answer: {HOSTILE}"


def test_a_table_piped_keeps_each_row_on_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """Not on a terminal (grep, a file), nothing is folded: a key stays whole."""
    from poller.cli.output import table

    key = "order:" + "x" * 300
    table(None, ["id", "key", "when"], [[1, key, "2026-12-06T10:00:00+00:00"]])
    lines = capsys.readouterr().out.splitlines()
    assert any(key in line and "2026-12-06T10:00:00+00:00" in line for line in lines)
