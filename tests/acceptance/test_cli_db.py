"""`poller db …` and `poller embedded …` through the real entry point."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from poller.cli import cli


def invoke(*args: str, **env: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def test_upgrade_then_current(empty_db_url: str) -> None:
    code, out, _ = invoke("db", "current", POLLER_DATABASE_URL=empty_db_url)
    assert code == 1 and out.startswith("not migrated")  # scripts: `current || upgrade`
    code, out, _ = invoke("db", "upgrade", POLLER_DATABASE_URL=empty_db_url)
    assert code == 0 and "database at revision" in out
    code, out, _ = invoke("db", "current", POLLER_DATABASE_URL=empty_db_url)
    assert code == 0 and " (head) — postgresql://postgres@127.0.0.1:" in out


def test_upgrade_gives_the_sql_doors_the_process_settings(empty_db_url: str) -> None:
    """The SQL doors read their limits from the database: `db upgrade` writes them."""
    import psycopg

    from poller.store.db import libpq_url

    env = {"POLLER_DATABASE_URL": empty_db_url, "POLLER_MAX_PAYLOAD_BYTES": "1000"}
    assert invoke("db", "upgrade", **env)[0] == 0
    with psycopg.connect(libpq_url(empty_db_url)) as conn:  # a new session sees them
        said = conn.execute(
            "SELECT current_setting('poller.max_payload_bytes'), "
            "current_setting('poller.max_attempts'), current_setting('poller.notify')"
        ).fetchone()
        assert said == ("1000", "10", "true")
        conn.execute("INSERT INTO poller_endpoints (name, url, secret, bucket) "
                     "VALUES ('b', 'http://127.0.0.1:9/', 'whsec_x', 1)")  # fmt: skip
        with pytest.raises(psycopg.Error) as refused:
            conn.execute(
                "SELECT poller_enqueue(endpoint => 'b', event_type => 'a', "
                "payload => %s, idempotency_key => 'k')",
                [f'{{"blob": "{"x" * 1000}"}}'],
            )
        assert refused.value.sqlstate == "WP007"


def test_a_schema_newer_than_this_package_says_so(empty_db_url: str) -> None:
    """A newer webhook-poller migrated the database: `db upgrade` cannot go back (Alembic
    raised on the unknown revision), and every command says to upgrade the package."""
    import sqlalchemy

    assert invoke("db", "upgrade", POLLER_DATABASE_URL=empty_db_url)[0] == 0
    engine = sqlalchemy.create_engine(
        empty_db_url.replace("postgresql://", "postgresql+psycopg://")
    )
    with engine.begin() as conn:
        conn.exec_driver_sql("UPDATE poller_alembic_version SET version_num = '0042'")
    engine.dispose()
    code, out, _ = invoke("db", "current", POLLER_DATABASE_URL=empty_db_url)
    assert code == 1 and "newer than this version knows" in out
    for args in (("db", "upgrade"), ("admin", "stats")):
        code, out, err = invoke(*args, POLLER_DATABASE_URL=empty_db_url)
        assert code == 2, out + err
        assert "'0042', which this version of webhook-poller does not know" in err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in out + err


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"POLLER_DATABASE_URL": "mysql://x@localhost/db"}, "must be a postgresql:// URL"),
        ({"POLLER_DATABASE_URL": "::not a url::"}, "POLLER_DATABASE_URL"),
        (
            {"POLLER_DATABASE_URL": "postgresql://postgres@127.0.0.1:1/x"},
            "cannot reach the database",
        ),
        ({"POLLER_SHARDS": "0"}, "POLLER_SHARDS"),
        ({"POLLER_CLAIM_LEASE": "1"}, "POLLER_CLAIM_LEASE"),
    ],
)
def test_expected_errors_are_one_line_and_exit_2(env: dict[str, str], message: str) -> None:
    code, out, err = invoke("db", "upgrade", **env)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("error: ") and message in err
    assert "Traceback" not in out + err


def _unreachable(*args: str) -> subprocess.CompletedProcess[str]:
    """`python -m poller ARGS` against a database nobody listens for."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLLER_")}
    env["POLLER_DATABASE_URL"] = "postgresql://postgres@127.0.0.1:1/x"
    return subprocess.run(
        [sys.executable, "-m", "poller", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_subprocess_error_has_no_traceback(tmp_path: Path) -> None:
    done = _unreachable("db", "current")
    assert done.returncode == 2
    assert (
        done.stderr.startswith("error: cannot reach the database")
        and "Traceback" not in done.stderr
    )


@pytest.mark.slow
def test_embedded_default_starts_once_and_stops(tmp_path: Path) -> None:
    env = {"POLLER_DATA_DIR": str(tmp_path / "data")}
    try:
        code, out, _ = invoke("db", "upgrade", **env)  # no URL: the embedded server
        assert code == 0, out
        code, first, _ = invoke("embedded", "start", **env)
        code, second, _ = invoke("embedded", "start", **env)
        assert first == second  # idempotent: the same running servers
        # and the web faces' token: `poller serve` in that shell needs nothing more
        exported = dict(re.findall(r"export (\w+)=(\S+)", first))
        from poller.settings import load_settings
        from poller.web.auth import credentials

        token = exported["POLLER_DASHBOARD_TOKEN"]
        settings = load_settings(
            database_url=exported["POLLER_DATABASE_URL"], dashboard_token=token
        )
        assert credentials(settings).token == token and len(token) >= 16
        port = int(re.search(r"127\.0\.0\.1:(\d+)/postgres", first).group(1))  # type: ignore[union-attr]
        code, out, _ = invoke("db", "current", **env)
        assert " (head) — embedded PostgreSQL in " in out  # data survived between commands
    finally:
        code, out, _ = invoke("embedded", "stop", **env)
    assert code == 0
    code, out, _ = invoke("embedded", "status", **env)
    assert out.count("stopped") == 2
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


def test_verbose_is_accepted_after_the_sub_command() -> None:
    done = _unreachable("db", "current", "--verbose")
    assert done.returncode == 2
    assert "Traceback" in done.stderr  # --verbose took effect
    assert done.stderr.rstrip().splitlines()[-1].startswith("error: cannot reach the database")


def test_a_read_only_command_never_starts_an_empty_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    code, _, err = invoke("admin", "stats")
    assert code == 2 and "no embedded PostgreSQL in" in err and "poller embedded start" in err
    assert not (tmp_path / ".poller").exists()


@pytest.mark.slow
def test_the_embedded_server_is_found_from_a_subfolder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As git finds .git: `poller admin stats` in project/src/app uses project/.poller."""
    project = tmp_path / "project"
    (project / "src" / "app").mkdir(parents=True)
    monkeypatch.chdir(project)
    try:
        code, out, _ = invoke("db", "upgrade")
        assert code == 0 and f"embedded PostgreSQL in {project / '.poller'}" in out
        monkeypatch.chdir(project / "src" / "app")
        code, out, _ = invoke("db", "current")
        assert code == 0 and f"embedded PostgreSQL in {project / '.poller'}" in out
        assert not (project / "src" / "app" / ".poller").exists()
    finally:
        monkeypatch.chdir(project)
        invoke("embedded", "stop")
