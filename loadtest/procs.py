"""Child processes for benchmarks and the load test: started, logged, always ended by PID."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# A reaper per child: a detached process that waits on pidfds of the harness and of the
# child, and ends the child (SIGTERM, SIGKILL 10 s later) if the harness ends first,
# however it ends (a SIGKILL, a second Ctrl-C): a load test killed mid-run left its
# pollers, receiver, app and locust running. A pidfd names one process for good, so
# no other process that comes to reuse the PID is ever signalled.
_REAP = """
import os, select, signal, sys
if os.fork():
    os._exit(0)
harness, child = int(sys.argv[1]), int(sys.argv[2])
ended, _, _ = select.select([harness, child], [], [])
if child not in ended:
    try:
        signal.pidfd_send_signal(child, signal.SIGTERM)
        if not select.select([child], [], [], 10.0)[0]:
            signal.pidfd_send_signal(child, signal.SIGKILL)
    except ProcessLookupError:
        pass
"""


def _reap_with_harness(child: int) -> None:
    """Start :data:`_REAP` for ``child`` (Linux 5.3+; elsewhere, nothing)."""
    try:
        fds = (os.pidfd_open(os.getpid()), os.pidfd_open(child))
    except (AttributeError, OSError):  # pragma: no cover - not Linux, or too old
        return
    try:
        subprocess.run(
            [sys.executable, "-I", "-c", _REAP, *map(str, fds)],
            pass_fds=fds,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C to the harness's group spares it
            timeout=30,
        )
    finally:
        for fd in fds:
            os.close(fd)


class Proc:
    """``python -m <module> …`` with its output in ``log``; :meth:`stop` ends it, and so
    does the end of this process, however it ends (:func:`_reap_with_harness`)."""

    def __init__(
        self,
        args: list[str],
        env: dict[str, str],
        log: Path,
        module: str = "poller",
        cwd: Path | None = None,
    ) -> None:
        """``cwd``: where it runs — another tree's ``poller`` is imported there first."""
        self.args, self.env, self.log, self.module, self.cwd = args, env, log, module, cwd
        self.handle = open(log, "a")  # noqa: SIM115 - closed in stop()
        self.popen = self._spawn()

    def _spawn(self) -> subprocess.Popen[bytes]:
        popen = subprocess.Popen(
            [sys.executable, "-m", self.module, *self.args],
            env=self.env,
            stdout=self.handle,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=self.cwd,
        )
        _reap_with_harness(popen.pid)
        return popen

    def restart(self) -> None:
        """After a kill: the same command again."""
        self.popen = self._spawn()

    def output(self) -> str:
        return self.log.read_text()

    def wait_for(self, pattern: str, timeout: float = 30) -> re.Match[str]:
        """The first match of ``pattern`` in the output; TimeoutError (with the output) if none."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = re.search(pattern, self.output())
            if found:
                return found
            if self.popen.poll() is not None:
                break
            time.sleep(0.05)
        raise TimeoutError(f"{pattern!r} not in {self.log}:\n{self.output()[-2000:]}")

    def signal(self, signum: int) -> None:
        self.popen.send_signal(signum)

    def wait(self, timeout: float) -> int:
        return self.popen.wait(timeout=timeout)

    def kill(self) -> None:
        self.popen.send_signal(signal.SIGKILL)
        self.popen.wait(timeout=10)

    def stop(self, timeout: float = 20, *, graceful: bool = True) -> None:
        """SIGTERM and wait (SIGKILL after ``timeout``), or SIGKILL at once."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM if graceful else signal.SIGKILL)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        self.handle.close()


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without POLLER_ settings, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLLER_")}
    env.update(extra)
    return env


def guarded(
    target: Callable[..., Any], errors: list[str], *release: threading.Event
) -> Callable[..., None]:
    """A thread body whose crash is reported (in ``errors``) instead of vanishing.

    On a crash it also sets ``release``, so nobody waits for work the thread
    will never finish; a normal return sets nothing (the target says itself
    when it is done).
    """

    def body(*args: Any) -> None:
        try:
            target(*args)
        except Exception as exc:
            errors.append(f"{target.__name__} crashed: {type(exc).__name__}: {exc}")
            for event in release:
                event.set()

    return body


def _stat(pid: int) -> list[str]:
    """Fields of /proc/PID/stat after the command name (field 3 onwards)."""
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()


def tree_cpu_seconds(root: int) -> float:
    """CPU seconds of ``root`` and every descendant alive now, plus what its ended
    children used (user + system, children's included: /proc/PID/stat)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents.setdefault(int(_stat(int(entry.name))[1]), []).append(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        try:
            fields = _stat(pid)
        except OSError:
            continue
        total += sum(int(f) for f in fields[11:15])
        todo.extend(parents.get(pid, ()))
    return total / os.sysconf("SC_CLK_TCK")


def machine_cpu_seconds() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot (/proc/stat)."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    idle = values[3] + values[4]
    return (sum(values) - idle) / os.sysconf("SC_CLK_TCK"), sum(values) / os.sysconf("SC_CLK_TCK")
