"""A caller's SIGCHLD disposition, set and restored around a test: SIG_IGN, or a handler that
reaps every child with ``waitpid(-1, WNOHANG)`` (common in servers); and descriptor counts."""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.forkserver
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

REAPERS = ("ignore", "reap_all")


def reap_all(signum: int, frame: object) -> None:
    """A server's SIGCHLD handler: collect every child that exited, whoever started it."""
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


@contextlib.contextmanager
def sigchld(mode: str) -> Iterator[None]:
    """SIGCHLD set to SIG_IGN (``"ignore"``) or to ``reap_all``; the old disposition back after."""
    previous = signal.signal(signal.SIGCHLD, signal.SIG_IGN if mode == "ignore" else reap_all)
    try:
        yield
    finally:
        signal.signal(signal.SIGCHLD, previous)


def open_fds() -> set[int]:
    return {int(fd) for fd in os.listdir("/proc/self/fd")}


def warm_up(start_method: str) -> None:
    """Start the session's helpers (the forkserver) before a descriptor baseline is taken."""
    if start_method == "forkserver":
        multiprocessing.get_context("forkserver")
        multiprocessing.forkserver.ensure_running()


def wait_pid_free(pid: int, within_s: float = 5.0) -> bool:
    """True once no process has ``pid`` (it exited and someone reaped it)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.005)
    return False


def stranger_at(pid: int, tries: int = 20) -> subprocess.Popen[bytes] | None:
    """A process unrelated to the executor that gets the freed ``pid`` (through
    ns_last_pid); None when the kernel does not let us choose the next pid."""
    path = "/proc/sys/kernel/ns_last_pid"
    for _ in range(tries):
        try:
            with open(path, "w") as f:
                f.write(str(pid - 1))
        except OSError:
            return None
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        if proc.pid == pid:
            return proc
        proc.kill()  # another process took the pid first: try again
        proc.wait()
    return None
