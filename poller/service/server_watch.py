"""Throwaway embedded servers stopped when the process that started them ends.

A benchmark's or a test session's server (poller/local/embedded.py) runs in its own
session, so it outlives a process that is killed, or leaves by ``os._exit`` (a
second Ctrl-C on ``poller run``), before its cleanup ran: that left a
PostgreSQL running, with its folder, behind every such benchmark.
:func:`stop_at_exit` hands the server to a watcher process of its own.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path

from poller.errors import EmbeddedServerError
from poller.local.brokers import EmbeddedNats, EmbeddedRabbitMQ
from poller.local.embedded import START_TIMEOUT, EmbeddedPostgres, EmbeddedRedis, _pid_alive

Server = EmbeddedPostgres | EmbeddedRedis | EmbeddedNats | EmbeddedRabbitMQ
_KINDS: dict[str, type[EmbeddedRedis | EmbeddedNats | EmbeddedRabbitMQ]] = {
    "redis": EmbeddedRedis,
    "nats": EmbeddedNats,
    "rabbitmq": EmbeddedRabbitMQ,
}

_WATCH = (  # forks at once: the watcher is no child of the process it watches
    "import os, sys\n"
    "if os.fork():\n"
    "    os._exit(0)\n"
    "from poller.service.server_watch import _watch\n"
    "_watch(*sys.argv[1:])\n"
)


def stop_at_exit(server: Server, *, remove: Path | None = None, pid: int | None = None) -> None:
    """Stop ``server`` (and remove the folder ``remove``) once this process — or the one
    ``pid`` names: a test run's controller, whose workers share a broker — has ended,
    however it ends: a watcher process of its own waits on a pidfd of it (no
    polling), then stops the server — nothing to do when the cleanup did it first."""
    kind = next((k for k, made in _KINDS.items() if isinstance(server, made)), "postgres")
    args = [sys.executable, "-c", _WATCH, kind, str(server.data_dir), str(remove or "")]
    pid = os.getpid() if pid is None else pid
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # pragma: no cover - Linux before 5.3, other systems
        pidfd = -1
    try:
        subprocess.run(
            [*args, str(pidfd), str(pid)],
            pass_fds=(pidfd,) if pidfd >= 0 else (),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C to this process's group spares it
            timeout=START_TIMEOUT,
        )
    finally:
        if pidfd >= 0:
            os.close(pidfd)


def _watch(kind: str, data_dir: str, remove: str, pidfd: str, pid: str) -> None:
    """The watcher of :func:`stop_at_exit`: wait for the process to end, then stop."""
    if int(pidfd) >= 0:
        select.select([int(pidfd)], [], [])  # readable once the process has ended
    else:  # pragma: no cover - no pidfd on this system
        while _pid_alive(int(pid)):
            time.sleep(0.5)
    folder = Path(data_dir)
    server = _KINDS[kind](folder) if kind in _KINDS else EmbeddedPostgres(folder, durable=False)
    with contextlib.suppress(EmbeddedServerError, OSError):
        server.stop()
    if remove:
        shutil.rmtree(remove, ignore_errors=True)
