"""Output and input helpers shared by the operator commands.

Tables for people (rich), one JSON document for scripts (``--json``: arrays
for lists, stable field names, ISO 8601 UTC times). Durations are ``90s``,
``15m``, ``1h``, ``7d`` (or plain seconds); ``--since`` also takes an ISO 8601
time. Destructive commands ask before acting; without a terminal they refuse
unless given ``--yes``.

Text from outside (a receiver's answer and error, a payload) reaches a
terminal only through :func:`safe_text` or :func:`emit_json`: a character a
terminal could act on (C0 and C1 controls, ESC sequences, bidi overrides) is
shown as its escape, and table cells are never read as rich markup (a receiver
answering ``[/x]`` crashed ``admin failed``; ``[link=…]`` made a hyperlink).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import click

from poller.errors import InvalidInput
from poller.observe.logs import printable, printable_json
from poller.rules import parse

F = TypeVar("F", bound=Callable[..., Any])


def json_option(func: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="One JSON document.")(func)


def yes_option(func: F) -> F:
    return click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")(func)


class Duration(click.ParamType[timedelta]):
    """``90s``, ``15m``, ``1h``, ``7d``, ``2w`` or plain seconds
    (:func:`poller.rules.parse.duration`)."""

    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            return parse.duration(value)
        except InvalidInput as exc:
            self.fail(str(exc), param, ctx)


class Since(click.ParamType[datetime]):
    """A duration ago (``1h``) or an ISO 8601 time (:func:`poller.rules.parse.moment`)."""

    name = "since"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            return parse.moment(value)
        except InvalidInput as exc:
            self.fail(str(exc), param, ctx)


class Until(click.ParamType[datetime]):
    """A duration from now (``2h``) or an ISO 8601 time (:func:`poller.rules.parse.deadline`)."""

    name = "until"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            return parse.deadline(value)
        except InvalidInput as exc:
            self.fail(str(exc), param, ctx)


class RowId(click.ParamType[int]):
    """A message or event id (:func:`poller.rules.parse.row_id`)."""

    name = "id"

    def __init__(self, what: str = "message") -> None:
        self.what = what

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            return parse.row_id(value, self.what)
        except InvalidInput as exc:
            self.fail(str(exc), param, ctx)


def iso(value: datetime | None) -> str | None:
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z") if value else None


def age(value: datetime | None, now: datetime | None = None) -> str:
    """``3m ago`` / ``in 20s`` for tables."""
    if value is None:
        return "-"
    seconds = ((now or datetime.now(UTC)) - value).total_seconds()
    ahead, seconds = seconds < 0, abs(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            text = f"{int(seconds // size)}{unit}"
            break
    else:
        text = f"{int(seconds)}s"
    return f"in {text}" if ahead else f"{text} ago"


def safe_text(text: str) -> str:
    """``text`` with each character a terminal could act on spelled as an escape."""
    return printable(text)


# A value quoted in an error (click's "Invalid value for '--x': '…'" and ours): past
# 100 characters only its start is shown, so a 20 KB argument is not a 20 KB line.
_LONG_QUOTED = re.compile(r"""(?<![^\s(\[=])(['"])([^'"\n]{60})[^'"\n]{40,}\1(?=[\s.,;:)\]]|$)""")


def error_text(text: str) -> str:
    """An error's one line: :func:`safe_text`, with long quoted values cut short."""
    return safe_text(_LONG_QUOTED.sub(lambda m: f"{m[1]}{m[2]}…{m[1]}", text))


def safe_json(document: Any, **dumps: Any) -> str:
    """JSON with every character a terminal could act on escaped (poller/observe/logs.py)."""
    return printable_json(document, **dumps)


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        return iso(value)
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def emit_json(document: Any) -> None:
    click.echo(safe_json(_plain(document), indent=2))


def cell(value: object) -> Any:
    """A table cell: the value's text, escaped (:func:`safe_text`), never read as markup."""
    from rich.text import Text  # here, as below: `poller … --help` need not load rich

    return Text("-" if value is None else safe_text(str(value)))


def table(title: str | None, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    view = Table(title=title, show_lines=False)
    for column in columns:
        view.add_column(column, overflow="fold")
    for row in rows:
        view.add_row(*(cell(v) for v in row))
    # On a terminal, folded to fit; piped (to grep, a file, a pager), one line a row
    # whatever its length: a key or a timestamp split over lines matches nothing.
    console = Console()
    console.width = max(100, console.width) if console.is_terminal else 100_000
    console.print(view)


def confirm(question: str, yes: bool) -> None:
    """Ask, unless ``--yes``; refuse (exit 2) without a terminal to ask on."""
    if yes:
        return
    if not sys.stdin.isatty():
        click.echo(f"error: {question} — refusing without --yes (no terminal to ask)", err=True)
        sys.exit(2)
    if not click.confirm(question, default=False):
        click.echo("aborted", err=True)
        sys.exit(1)


ROW_ID = RowId("message")
"""A message id: a positive bigint (larger ones are a usage error, not a database error)."""
EVENT_ID = RowId("event")
