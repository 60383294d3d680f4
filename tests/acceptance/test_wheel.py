"""An installed (non-editable) wheel migrates on its own: the migrations ship inside it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import repo_root


@pytest.fixture(scope="module")
def installed_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project built as a wheel and unpacked into a folder of its own (no deps)."""
    work = tmp_path_factory.mktemp("wheel")
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
    subprocess.run(
        [
            *pip,
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(work / "dist"),
            str(repo_root()),
        ],
        check=True,
        timeout=120,
    )
    (wheel,) = (work / "dist").glob("webhook_poller-*.whl")
    target = work / "site"
    subprocess.run(
        [*pip, "install", "--no-deps", "--target", str(target), str(wheel)], check=True, timeout=120
    )
    return target


def _run(site: Path, cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("POLLER_")}
    environ.update(env, PYTHONPATH=str(site))
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.slow
def test_installed_wheel_upgrades_an_empty_database(
    installed_wheel: Path, empty_db_url: str, tmp_path: Path
) -> None:
    where = _run(installed_wheel, tmp_path, "-c", "import poller; print(poller.__file__)")
    assert where.stdout.strip().startswith(str(installed_wheel)), where.stderr
    assert (installed_wheel / "poller" / "_migrations" / "env.py").exists()
    dashboard = installed_wheel / "poller" / "dashboard"  # its pages and assets ship too
    assert (dashboard / "templates" / "overview.html").exists()
    assert (dashboard / "static" / "dashboard.js").exists()

    done = _run(
        installed_wheel, tmp_path, "-m", "poller", "db", "upgrade", POLLER_DATABASE_URL=empty_db_url
    )
    assert done.returncode == 0, done.stderr
    current = _run(
        installed_wheel, tmp_path, "-m", "poller", "db", "current", POLLER_DATABASE_URL=empty_db_url
    )
    assert " (head) — " in current.stdout, current.stdout + current.stderr
