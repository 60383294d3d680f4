"""Every CLI command against an unmigrated and an unreachable database: one line, exit 2,
no traceback, no secret, no SQL parameters."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from poller.cli import cli
from poller.local.embedded import free_port

COMMANDS = [
    ["endpoints", "add", "billing", "https://hooks.example.com/in"],  # generates a secret
    ["endpoints", "update", "billing", "--url", "https://hooks.example.com/v2"],
    ["endpoints", "list"],
    ["endpoints", "health"],
    ["endpoints", "update", "billing", "--rate-limit", "50", "--circuit-failures", "default"],
    ["endpoints", "show", "billing"],
    ["endpoints", "enable", "billing"],
    ["endpoints", "disable", "billing", "--yes"],
    ["endpoints", "rotate-secret", "billing", "--yes"],
    ["endpoints", "secret", "billing"],
    ["endpoints", "rotate-key", "--yes"],
    ["endpoints", "remove", "billing", "--yes"],
    ["enqueue", "billing", "invoice.paid", "--data", '{"card": "4111-1111-1111"}', "--key", "k1"],
    ["admin", "stats"],
    ["admin", "failed"],
    ["admin", "show", "1"],
    ["admin", "retry", "1", "--yes"],
    ["admin", "purge", "--delivered-older-than", "7d", "--yes"],
    ["admin", "leases"],
    ["admin", "blocked"],
    ["admin", "skip", "1", "--yes"],
    ["enqueue", "billing", "order.paid", "--data", "{}", "--key", "k2", "--ordering-key", "o:1"],
]


def _run(args: list[str], url: str) -> tuple[int, str]:
    result = CliRunner().invoke(
        cli, args, env={"POLLER_DATABASE_URL": url, "POLLER_ELECTION": "postgres"}
    )
    return result.exit_code, result.output


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(a[:2]))
def test_on_an_unmigrated_database(args: list[str], empty_db_url: str) -> None:
    code, output = _run(args, empty_db_url)
    assert code == 2, output
    assert output.strip().splitlines() == [output.strip()]  # one line
    assert "schema is at nothing" in output and "poller db upgrade" in output
    assert "Traceback" not in output and "whsec_" not in output and "4111-1111" not in output


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(a[:2]))
def test_on_an_unreachable_database(args: list[str]) -> None:
    code, output = _run(args, f"postgresql://postgres@127.0.0.1:{free_port()}/x")
    assert code == 2, output
    assert output.strip().splitlines() == [output.strip()]
    assert output.startswith("error: cannot reach the database")
    assert "Traceback" not in output and "whsec_" not in output and "4111-1111" not in output
