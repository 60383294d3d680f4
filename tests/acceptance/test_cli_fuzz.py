"""Every operator command against values nobody should type, drawn by hypothesis.

The commands are read from the click tree (a new command or option is fuzzed
without touching this file); each parameter is left out or given a nasty value
(NULs, bidi controls, numbers past bigint, dates past year 9999, 5,000-character
strings, shell and SQL metacharacters). Whatever the command, the answer is exit
0, 1 (one line saying what was not found or matched) or 2 (one line, ``error: …``,
click's usage errors too) — never a traceback, never an exception escaping the
CLI, never 70 (an unexpected exception: a bug). Commands that serve, start
servers or run until stopped are left out; they have their own tests.
"""

from __future__ import annotations

import os
import re
from typing import Any

import click
from click.testing import CliRunner
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine

from poller.cli import BUG_HINT, cli
from tests.conftest import make_endpoint
from tests.integration.helpers import seed

NOT_FOUND = re.compile(r"error: (unknown |no |nothing )[^\n]*\n|aborted\n")
LONG_RUNNING = {"run", "demo", "dashboard", "receiver", "embedded"}
NASTY_TEXT = [
    "",
    " ",
    "\x00",
    "a\x00b",
    "\u202e",
    "\udcff",  # a byte that was not UTF-8 on a real command line
    "a\ud800b",
    "\x1b[31m",
    "-",
    "--",
    "%s%n",
    "'; DROP TABLE poller_outbox; --",
    "$(touch /tmp/pwned)",
    "<script>",
    "billing",
    "*",
    "order.*",
    "http://2130706433/",
    "http://127.0.0.1:9/{idempotency_key}",
    "file:///etc/passwd",
    "{}",
    "[]",
    '{"a": 1e999}',
    '{"a": NaN}',
    "null",
    "x" * 5000,
]
NASTY_NUMBERS = ["0", "-1", "1", "3", "9" * 19, "9" * 40, "1e308", "nan", "inf", "-inf", "0x10"]
NASTY_TIMES = ["0s", "1h", "5m", "7d", "99999999999d", "-5m", "now", "2026-13-45",
               "9999-12-31T23:59:59", "0001-01-01T00:00:00+00:00", "1970-01-01"]  # fmt: skip
NASTY = st.sampled_from(NASTY_TEXT + NASTY_NUMBERS + NASTY_TIMES) | st.text(max_size=30)


def _commands(group: click.Group, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    found: list[tuple[tuple[str, ...], Any]] = []
    ctx = click.Context(group)
    for name in group.list_commands(ctx):  # the top group loads its commands lazily
        command = group.get_command(ctx, name)
        if name in LONG_RUNNING or command is None:
            continue
        if isinstance(command, click.Group):
            found += _commands(command, (*path, name))
        else:
            found.append(((*path, name), command))
    return found


COMMANDS = _commands(cli)


def _value(param: click.Parameter) -> st.SearchStrategy[str]:
    """A nasty value, or (as often) a plausible one, so that runs get past parsing and
    reach the database, where the unexpected failures are."""
    kind = param.type.name
    if isinstance(param.type, click.Choice):
        return st.sampled_from([*map(str, param.type.choices), "nope", ""])
    if "integer" in kind or "float" in kind or "number" in kind or kind == "id":
        return st.sampled_from(["1", "2", "50"]) | st.sampled_from([*NASTY_NUMBERS, "default"])
    if kind in ("since", "duration"):
        return st.sampled_from(["5m", "1h", "7d", "2026-01-01T00:00:00Z"]) | NASTY
    return st.sampled_from(["billing", "order.paid", "k1", '{"n": 1}']) | NASTY


@st.composite
def invocations(draw: st.DrawFn) -> list[str]:
    path, command = draw(st.sampled_from(COMMANDS))
    args, positional = list(path), ["--"]  # after "--", values may start with "-"
    for param in command.params:
        if isinstance(param, click.Argument):
            count = 1 if param.nargs == 1 else draw(st.integers(1, 3))
            if param.required or draw(st.booleans()):
                positional += [draw(_value(param)) for _ in range(count)]
            continue
        assert isinstance(param, click.Option)
        if param.name == "yes":
            args.insert(len(path), "--yes")  # never wait on a prompt
        elif param.is_flag:
            if draw(st.booleans()):
                args.insert(len(path), param.opts[0])
        elif param.required or draw(st.booleans()):
            args[len(path) : len(path)] = [param.opts[0], draw(_value(param))]
    return args + positional


@settings(
    max_examples=150,
    deadline=None,
    derandomize=bool(os.environ.get("CI")),  # CI: the same examples; elsewhere new ones
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(args=invocations())
@example(args=["endpoints", "update", "--ca-bundle", "\x00", "--", "billing"])  # was a bug
@example(args=["enqueue", "billing", "e", "--data", "@\x00", "--key", "k"])  # was a bug
@example(args=["publish", "--key", "billing", "--data", '{"a": NaN}', "--", "billing"])  # was a bug
@example(args=["enqueue", "billing", "e", "--data", '{"a": Infinity}', "--key", "k"])
@example(args=["publish", "--key", "k", "--data", '{"a": 1e999999}', "--", "billing"])  # was a bug
@example(args=["endpoints", "update", "--timeout", "x" * 5000, "--", "billing"])  # 5 KB line
def test_nasty_command_lines_get_one_line_never_a_traceback(
    engine: Engine, db_url: str, args: list[str]
) -> None:
    with engine.begin() as conn:
        has = conn.exec_driver_sql("SELECT count(*) FROM poller_endpoints").scalar()
    if not has:  # the fixture's database lives as long as the whole test
        make_endpoint(engine, "billing")
        seed(engine, 3, "billing")
    result = CliRunner().invoke(cli, args, env={"POLLER_DATABASE_URL": db_url}, input="")
    output = result.output
    assert "Traceback" not in output, (args, output[-2000:])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"{args!r} raised {result.exception!r}") from result.exception
    assert result.exit_code in (0, 1, 2), (args, result.exit_code, output[-500:])
    assert BUG_HINT not in result.stderr, (args, result.stderr[-500:])
    if result.exit_code == 2:  # usage, configuration, bad input: one line
        assert result.stderr.startswith("error: "), (args, result.stderr[-500:])
        assert len(result.stderr.strip().splitlines()) == 1, (args, result.stderr[-500:])
        assert len(result.stderr) < 1000, (args, result.stderr[:500])  # a value cut short
    if result.exit_code == 1 and result.stderr:  # not found, nothing matched: one line, so
        assert NOT_FOUND.fullmatch(result.stderr), (args, result.stderr[-500:])
