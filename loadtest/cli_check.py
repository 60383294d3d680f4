"""The operator CLI and the poller logs against what a run left behind.

Used by the fault hunt (loadtest/hunt.py) after each seed: the commands an operator
runs first (`admin failed`, `admin show`, `endpoints health`, `admin stats`) must
answer on whatever hostile receivers and faults wrote, and neither they nor the
pollers' log lines may carry a character a terminal would act on (ESC and C1
sequences, bidi overrides): receivers' answers reach both.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from click.testing import CliRunner
from sqlalchemy import text

from poller.cli import cli

SHOWN = 5  # failed messages looked at with `admin show`


def _acting(text: str) -> str | None:
    """The first character a terminal could act on, if any (newlines end lines)."""
    return next((c for c in text if not c.isprintable() and c != "\n"), None)


def cli_disagrees(engine: Any, db_url: str, logs: list[Path]) -> list[str]:
    """One line per command that failed or printed a character a terminal acts on, and
    per log file holding one."""
    with engine.connect() as conn:
        failed = [
            int(i)
            for i in conn.execute(
                text("SELECT id FROM poller_outbox WHERE status = 'failed' ORDER BY id LIMIT :n"),
                {"n": SHOWN},
            ).scalars()
        ]
        answered = [  # messages whose attempts kept a receiver's words
            int(i)
            for i in conn.execute(
                text(
                    "SELECT DISTINCT message_id FROM poller_delivery_attempts "
                    "WHERE response_excerpt IS NOT NULL AND response_excerpt <> 'ok' "
                    "ORDER BY message_id LIMIT :n"
                ),
                {"n": SHOWN},
            ).scalars()
        ]
    commands = [
        ["admin", "failed", "--limit", "200"],
        ["admin", "failed", "--limit", "200", "--json"],
        ["endpoints", "health"],
        ["admin", "stats"],
        *(["admin", "show", str(i)] for i in sorted({*failed, *answered})),
    ]
    problems = []
    for args in commands:
        result = CliRunner().invoke(cli, args, env={"POLLER_DATABASE_URL": db_url})
        said = " ".join(args)
        none_failed = args[:2] == ["admin", "failed"] and not failed and result.exit_code == 1
        if result.exit_code != 0 and not none_failed:
            problems.append(f"cli: `{said}` exited {result.exit_code}: {result.output[-300:]!r}")
        elif (char := _acting(result.output)) is not None:
            problems.append(f"cli: `{said}` printed {char!r}")
    for log in logs:
        if log.exists() and (char := _acting(log.read_text(errors="replace"))) is not None:
            problems.append(f"logs: {log.name} holds {char!r}")
    return problems
