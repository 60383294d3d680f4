"""An installed (non-editable) wheel migrates on its own: the migrations ship inside it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import repo_root

PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`python -m build`: an sdist, and a wheel it builds from the sdist alone (what
    a release publishes). The wheel's path."""
    dist = tmp_path_factory.mktemp("dist")
    built = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(repo_root())],
        capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    assert len(list(dist.glob("webhook_poller-*.tar.gz"))) == 1
    (wheel,) = dist.glob("webhook_poller-*.whl")
    return wheel


@pytest.fixture(scope="module")
def installed_wheel(release: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The release's wheel unpacked into a folder of its own (no dependencies)."""
    target = tmp_path_factory.mktemp("wheel") / "site"
    subprocess.run(
        [*PIP, "install", "--no-deps", "--target", str(target), str(release)],
        check=True, timeout=120,
    )  # fmt: skip
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


@pytest.mark.slow
def test_the_release_builds_and_its_wheel_runs_the_demo_in_a_clean_venv(
    release: Path, tmp_path: Path
) -> None:
    """The release's wheel installs into a new virtualenv, whose `poller` runs the demo.
    The dependencies come from the test's own environment (a path, not its site: no
    editable install leaks in), so nothing is downloaded; the outer pip installs into the
    virtualenv (making it with a pip of its own took 9 of this test's 39 s)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run(
        [*PIP, "--python", str(python), "install", "--no-deps", str(release)],
        check=True, timeout=180,
    )  # fmt: skip
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    deps = subprocess.run(
        [sys.executable, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    Path(site, "_test_dependencies.pth").write_text(deps + "\n")
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("POLLER_", "VIRTUAL_ENV"))}
    where = subprocess.run(
        [python, "-c", "import poller; print(poller.__file__, poller.__version__)"],
        cwd=tmp_path, capture_output=True, text=True, env=environ, check=False,
    )  # fmt: skip
    assert where.stdout.startswith(site), where.stdout + where.stderr  # the wheel's, not ours
    demo = subprocess.run(
        [venv / "bin" / "poller", "demo", "--messages", "200", "--timeout", "60"],
        cwd=tmp_path, capture_output=True, text=True, env=environ, timeout=120, check=False,
    )  # fmt: skip
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert "delivered" in demo.stdout
