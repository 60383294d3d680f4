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
    web = installed_wheel / "poller" / "web"  # the faces' pages and assets ship too
    assert (web / "templates" / "overview.html").exists()
    assert (web / "static" / "dashboard.js").exists()

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


SERVICE_ONLY = ("aiohttp", "httpx", "pyreqwest", "starlette", "uvicorn", "jinja2", "redis",
                "prometheus_client", "cryptography", "rich")  # fmt: skip


def _bare_dependencies(folder: Path) -> Path:
    """The distributions the bare install brings (webhook-poller's requirements without
    extras, and theirs), linked into ``folder`` from this environment: what
    ``pip install webhook-poller`` would put beside the wheel, without a download."""
    from importlib import metadata

    from packaging.requirements import Requirement

    wanted: list[tuple[str, str]] = [("webhook-poller", "")]
    seen: set[str] = set()
    while wanted:
        name, extra = wanted.pop()
        dist = metadata.distribution(name)
        key = f"{dist.metadata['Name'].lower()}[{extra}]"
        if key in seen:
            continue
        seen.add(key)
        for text in dist.requires or ():
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": extra}):
                wanted += [(req.name, e) for e in req.extras] + [(req.name, "")]
        if name == "webhook-poller":
            continue
        for top in {Path(str(f)).parts[0] for f in dist.files or ()}:
            source = Path(str(dist.locate_file(top)))
            if top not in ("..", "bin") and source.exists() and not (folder / top).exists():
                (folder / top).symlink_to(source)
    return folder


@pytest.mark.slow
def test_the_bare_install_enqueues_migrates_and_says_what_the_service_needs(
    installed_wheel: Path, empty_db_url: str, tmp_path: Path
) -> None:
    """``pip install webhook-poller`` (no extra) is light: none of the service's stacks,
    yet an application migrates, enqueues and publishes in its own transaction, and
    ``poller run`` says in one line what to install."""
    (tmp_path / "deps").mkdir()
    bare = _bare_dependencies(tmp_path / "deps")
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("POLLER_", "PYTHON"))}
    environ.update(PYTHONPATH=f"{installed_wheel}:{bare}", POLLER_DATABASE_URL=empty_db_url)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys._base_executable, "-S", *args],  # no site-packages: only the bare install
            cwd=tmp_path, env=environ, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip

    upgraded = run("-m", "poller", "db", "upgrade")
    assert upgraded.returncode == 0, upgraded.stderr[-2000:]
    from poller.store.db import sync_engine
    from tests.conftest import make_endpoint

    engine = sync_engine(empty_db_url)
    make_endpoint(engine, "billing", event_types=["order.*"])
    engine.dispose()
    app = run("-c", f"""
import importlib.util, psycopg, poller
from poller.store.db import libpq_url
missing = [m for m in {SERVICE_ONLY!r} if importlib.util.find_spec(m) is None]
with psycopg.connect(libpq_url({empty_db_url!r})) as conn:
    sent = poller.enqueue(conn, endpoint="billing", event_type="order.paid",
                          payload={{"id": 1}}, idempotency_key="order:1")
    published = poller.publish(conn, event_type="order.paid", payload={{"id": 1}},
                               idempotency_key="order:1:paid")
print(len(missing), sent > 0, published.deliveries)
""")  # fmt: skip
    assert app.returncode == 0, app.stderr[-2000:]
    missing, sent, deliveries = app.stdout.split(maxsplit=2)
    assert (int(missing), sent) == (len(SERVICE_ONLY), "True")
    assert "billing" in deliveries
    served = run("-m", "poller", "run")
    assert served.returncode == 2
    assert len(served.stderr.splitlines()) == 1, served.stderr
    line = served.stderr
    assert "needs webhook-poller[server]" in line and "pip install 'webhook-poller[server]'" in line
