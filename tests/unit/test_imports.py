"""What `import poller` and the CLI's start pull in (modules, not seconds: a count that
cannot flake). The budget itself (≤ 0.3 s for `poller --version`) is measured in the docs."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import click

from poller.cli import COMMANDS, cli

HEAVY_FOR_AN_APPLICATION = ("aiohttp", "starlette", "uvicorn", "prometheus_client", "httpx")
HEAVY_FOR_HELP = (*HEAVY_FOR_AN_APPLICATION, "sqlalchemy", "pydantic", "cryptography", "rich")
SERVING = {"run", "demo", "receiver"}  # they start servers; their modules load the stack


def _modules_after(code: str) -> set[str]:
    """Top-level packages loaded by a fresh interpreter after running ``code``."""
    report = "import sys, json\nprint(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"
    probe = f"{code}\n{report}"
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    return set(json.loads(done.stdout.strip().splitlines()[-1]))


def test_an_application_importing_poller_loads_no_web_http_or_metrics_stack() -> None:
    loaded = _modules_after("import poller\nfrom poller import enqueue, publish, Settings")
    assert not loaded & set(HEAVY_FOR_AN_APPLICATION), loaded & set(HEAVY_FOR_AN_APPLICATION)
    assert "sqlalchemy" in loaded  # enqueue itself was imported, not a stand-in


def test_import_poller_alone_loads_nothing_heavy() -> None:
    loaded = _modules_after("import poller")
    assert not loaded & set(HEAVY_FOR_HELP), loaded & set(HEAVY_FOR_HELP)


def test_version_and_every_group_help_load_no_core() -> None:
    helps = [["--version"], ["--help"]]
    for name in sorted(set(COMMANDS) - SERVING):
        helps.append([name, "--help"])
        command = cli.get_command(click.Context(cli), name)
        if isinstance(command, click.Group):
            helps += [[name, sub, "--help"] for sub in command.list_commands(click.Context(cli))]
    code = (
        "from click.testing import CliRunner\nfrom poller.cli import cli\n"
        f"for args in {helps!r}:\n"
        "    result = CliRunner().invoke(cli, args)\n"
        "    assert result.exit_code == 0, (args, result.output)\n"
    )
    loaded = _modules_after(code)
    assert not loaded & set(HEAVY_FOR_HELP), loaded & set(HEAVY_FOR_HELP)


def test_a_pollers_start_loads_no_migration_tooling_nor_the_optional_client() -> None:
    """`poller run` on a migrated database compares the version table with a constant
    (poller/store/migrate.py): Alembic, mako and pygments cost a tenth of its start-up CPU."""
    code = (
        "from poller.store import db\n"
        "from poller.observe import logs, otel\n"
        "from poller.service import processes, runner, ops\n"
        "from poller.deliver import sending, reqwest_sender  # the default client's sender\n"
        "from poller.store.migrate import head_revision\n"
        "assert head_revision()\n"
    )
    loaded = _modules_after(code)
    assert not loaded & {"alembic", "mako", "pygments", "httpx"}, loaded


def test_the_command_list_shows_each_commands_own_help() -> None:
    ctx = click.Context(cli)
    for name, (_, short) in COMMANDS.items():
        command = cli.get_command(ctx, name)
        assert command is not None and command.name in (name, f"{name}_"), name
        assert command.get_short_help_str(limit=500) == short, name


def test_no_public_name_of_poller_is_shadowed_by_a_submodule() -> None:
    """`from poller import publish` must be the function even after `import poller.outbox.publish`
    (a submodule called publish would replace it once imported)."""
    code = (
        "import pkgutil, importlib, poller\n"
        "for m in pkgutil.walk_packages(poller.__path__, 'poller.'):\n"
        "    if m.name != 'poller.__main__':  # that one runs the CLI\n"
        "        importlib.import_module(m.name)\n"
        "import types\n"
        "bad = [n for n in poller.__all__ if isinstance(getattr(poller, n), types.ModuleType)]\n"
        "assert not bad, bad\n"
    )
    _modules_after(code)


PLANTS = [  # (module, the import planted in it, the contract it breaks)
    ("poller/rules/retry.py", "import poller.local.embedded", "Pure modules"),
    ("poller/store/schema.py", "import poller.local.receiver", "Pure modules"),
    ("poller/store/schema.py", "import poller.store.queries", "The statements over the schema"),
    ("poller/cli/run.py", "import poller.web.api.routes", "The CLI starts the web faces"),
    ("poller/errors.py", "import poller.outbox.enqueue", "The rooms in layers"),
    ("poller/outbox/enqueue.py", "import poller.cli", "The rooms in layers"),
    ("poller/complete/completer.py", "import poller.claim.claimer", "The rooms in layers"),
    ("poller/web/api/routes.py", "import poller.web.dashboard.pages", "The web faces apart"),
    ("poller/web/base.py", "import poller.web.api.rest", "No import cycle"),
]


def test_the_import_contracts_fail_on_a_planted_violation(tmp_path: Path) -> None:
    """A check that cannot fail is no check: `make lint`'s import contracts, run on a
    copy of the tree, pass it as it is and fail each planted import, naming the
    contract it breaks."""
    root = Path(__file__).resolve().parents[2]
    shutil.copytree(
        root / "poller", tmp_path / "poller", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copy(root / "pyproject.toml", tmp_path / "pyproject.toml")
    lint = Path(sys.executable).with_name("lint-imports")

    def contracts() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(lint), "--no-cache", "--config", str(tmp_path / "pyproject.toml")],
            cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
            env={**os.environ, "PYTHONPATH": str(tmp_path)},
        )  # fmt: skip

    kept = contracts()
    assert kept.returncode == 0, kept.stdout[-2000:]
    for module, planted, contract in PLANTS:
        path = tmp_path / module
        clean = path.read_text()
        path.write_text(clean + f"\n{planted}  # planted\n")
        broken = contracts()
        path.write_text(clean)
        assert broken.returncode != 0, f"{planted} in {module} passed"
        assert f"{contract}" in broken.stdout.split("Broken contracts")[-1], broken.stdout[-2000:]


BUILDERS = {"select", "insert", "update", "delete", "text", "func", "and_", "or_", "tuple_"}
TABLES = {"outbox", "endpoints", "delivery_attempts", "event_log", "endpoint_health", "metadata"}


def test_no_statement_is_built_outside_the_store() -> None:
    """Every statement is named in poller/store/queries/: no module elsewhere imports
    SQLAlchemy's statement builders or the schema's tables (its constants it may)."""
    package = Path(__file__).resolve().parents[2] / "poller"
    found = []
    for path in package.rglob("*.py"):
        if path.relative_to(package).parts[0] == "store":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or node.module is None:
                continue
            names = {alias.name for alias in node.names}
            if node.module.startswith("sqlalchemy") and names & BUILDERS:
                found.append(f"{path.relative_to(package)}: {sorted(names & BUILDERS)}")
            if node.module.startswith("poller.store.schema") and names & TABLES:
                found.append(f"{path.relative_to(package)}: {sorted(names & TABLES)}")
    assert found == []
