"""``poller serve`` and ``poller demo --dashboard`` as commands: bad settings are one
line and exit 2; the demo serves its own database and prints a link that logs in."""

from __future__ import annotations

import re
import signal
import socket
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from poller.cli import cli
from tests.acceptance.procs import poller_env, started

TOKEN = "cli-dashboard-token-0123"


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        (["--addr", "nowhere"], {"POLLER_DASHBOARD_TOKEN": TOKEN}, "must be host:port"),
        ([], {"POLLER_DASHBOARD_TOKEN": "short"}, "at least 16 printable"),
        ([], {}, "needs credentials: set POLLER_DASHBOARD_TOKEN"),
        ([], {"POLLER_DASHBOARD_USER": "ops"}, "set both, or neither"),
    ],
)
def test_bad_settings_are_one_line_and_exit_2(
    db_url: str, args: list[str], env: dict[str, str], expected: str
) -> None:
    result = CliRunner().invoke(cli, ["serve", *args], env={"POLLER_DATABASE_URL": db_url, **env})
    assert result.exit_code == 2, result.output
    assert expected in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert "short" not in result.stderr  # a rejected token is not echoed


def test_a_taken_port_is_one_line_and_exit_2(db_url: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(
            cli,
            ["serve", "--addr", f"127.0.0.1:{port}"],
            env={"POLLER_DATABASE_URL": db_url, "POLLER_DASHBOARD_TOKEN": TOKEN},
        )
    assert result.exit_code == 2
    assert "cannot listen there" in result.stderr and "Traceback" not in result.stderr


def test_an_unmigrated_database_is_one_line_and_exit_2(empty_db_url: str) -> None:
    """(Through `poller dashboard`, serve's earlier name, which it still answers to.)"""
    result = CliRunner().invoke(
        cli,
        ["dashboard"],
        env={"POLLER_DATABASE_URL": empty_db_url, "POLLER_DASHBOARD_TOKEN": TOKEN},
    )
    assert result.exit_code == 2
    assert "poller db upgrade" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.slow
def test_demo_serves_its_dashboard_until_sigterm(tmp_path: Path) -> None:
    env = poller_env(POLLER_DASHBOARD_ADDR="127.0.0.1:0")
    with started(["demo", "--messages", "100", "--dashboard"], env, tmp_path / "demo.log") as demo:
        link = demo.wait_for(r"open (http://127\.0\.0\.1:\d+)/login\?token=(\S+)", timeout=120)
        base, token = link.group(1), link.group(2)
        with httpx.Client(base_url=base, follow_redirects=False, timeout=10) as web:
            assert web.get("/").status_code == 303  # no credentials, no page
            assert web.get(f"/login?token={token}").status_code == 303
            page = web.get("/")
            assert page.status_code == 200
            delivered = re.search(r'data-status="delivered">([\d,]+)<', page.text)
            assert delivered and int(delivered.group(1).replace(",", "")) >= 100
            assert "legacy" in web.get("/endpoints").text
        portal = demo.wait_for(r"portal .* open (http://127\.0\.0\.1:\d+)(/portal/start\S+)")
        with httpx.Client(base_url=portal.group(1), follow_redirects=False, timeout=10) as web:
            assert web.get(portal.group(2)).status_code == 303  # a session for acme
            mine = web.get("/portal/").text
            assert "acme" in mine and "legacy" not in mine  # acme's endpoints alone
        demo.signal(signal.SIGTERM)
        assert demo.wait(timeout=30) == 0, demo.output()
        # ... and only then stops its embedded servers, as without --dashboard.
        servers = re.findall(r"(?:postgresql|redis)://\S*?127\.0\.0\.1:(\d+)", demo.output())
        assert len(servers) == 2
        for port in servers:
            with pytest.raises(OSError):
                socket.create_connection(("127.0.0.1", int(port)), timeout=1).close()


def test_the_customers_faces_can_be_served_apart_from_the_operators(
    db_url: str, tmp_path: Path
) -> None:
    """POLLER_PORTAL_ADDR: the portal and the API on their own address — what a customer
    may be shown — and the operator's pages only on the dashboard's."""
    env = poller_env(POLLER_DATABASE_URL=db_url, POLLER_DASHBOARD_TOKEN=TOKEN,
                     POLLER_DASHBOARD_ADDR="127.0.0.1:0", POLLER_PORTAL_ADDR="127.0.0.1:0",
                     POLLER_PORTAL_KEY="portal-test-key-0123456789abcdef0123")  # fmt: skip
    with started(["serve"], env, tmp_path / "serve.log") as served:
        operators = served.wait_for(r"dashboard \+ api .* on (http://\S+)/").group(1)
        customers = served.wait_for(r"portal \+ api .* on (http://\S+)/").group(1)
        bearer = {"Authorization": f"Bearer {TOKEN}"}
        with httpx.Client(follow_redirects=False, timeout=10) as web:
            assert web.get(f"{operators}/", headers=bearer).status_code == 200
            assert web.get(f"{operators}/portal/start?link=x").status_code == 404
            assert web.get(f"{customers}/portal/start?link=x").status_code == 401
            assert web.get(f"{customers}/api/v1/endpoints", headers=bearer).status_code == 200
            for path in ("/", "/login", "/failed", "/endpoints"):
                assert web.get(f"{customers}{path}", headers=bearer).status_code == 404, path
