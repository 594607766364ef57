"""Whether a worker process has ended, and how, whoever reaps it: read from its pidfd.

    pidfd readable ──► ended ──► waitid(P_PIDFD, fd, WEXITED | WNOHANG) ──► its exit code
         │                          └─ ECHILD: another handler reaped it (SIGCHLD set to
         │                             SIG_IGN, or a SIGCHLD handler waiting for any child)
         │                             ──► Ended(code=None): ended, exit status unknown
         └─ not readable ──► running
    signals: pidfd_send_signal(fd, sig) ── never reaches a pid that was freed and reused

multiprocessing's ``Process.exitcode``, ``join`` and ``is_alive`` wait by pid: once another
handler reaped the child they say "still running" forever (waitpid fails with ECHILD and
they return None), and ``os.kill(pid)`` then signals whatever process got the pid next.
Neither decides anything here.  A forkserver's worker is the forkserver's child, not
ours (waitid says ECHILD): its status is multiprocessing's, which the forkserver writes to
the sentinel after reaping it (no waitpid by pid here).  A process without a pidfd (fd -1: a kernel without
``pidfd_open``) falls back to its sentinel pipe plus ``exitcode``: a readable sentinel
without an exit code means it ended and someone else reaped it.

Invariants:
- Only ``ended`` reaps, under one lock, and it hands the exit code to multiprocessing
  (``Popen.returncode``), so multiprocessing never waits by pid for a process we reaped.
- ``Ended(code=None)`` means "ended, exit status unknown", never "still running".
- Nothing here blocks without a timeout and nothing loops on a readable fd: a waiter
  drops every process that has ended before it waits again.
"""

from __future__ import annotations

import os
import select
import signal
import threading
import time
from collections.abc import Sequence
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from typing import NamedTuple

_REAP_LOCK = threading.Lock()  # one reaper at a time: two waitids would lose a status
_WAITABLE_S = 0.5  # without a pidfd: how long a closed sentinel may precede a waitable exit


class Ended(NamedTuple):
    """How a process ended: its exit code (negative: the signal), or None when another
    handler reaped it first and the status is gone."""

    code: int | None


def _readable(fd: int) -> bool:
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


def has_ended(process: BaseProcess, fd: int) -> bool:
    """True once ``process`` has exited (its pidfd ``fd`` is readable); reaps nothing
    (without a pidfd: multiprocessing's exit code or a readable sentinel)."""
    if fd >= 0:
        return _readable(fd)
    return process.exitcode is not None or _readable(process.sentinel)


def ended(process: BaseProcess, fd: int) -> Ended | None:
    """None while ``process`` runs; else how it ended (reaping it, if nobody did yet)."""
    end = _reap(process, fd)
    if end == Ended(None) and _forkserved(process):
        # Not our child but the forkserver's, which reaps it and then writes its status to
        # the sentinel (no waitpid by pid on this side): wait briefly for that report.
        process.join(1.0)
        code = process.exitcode
        return Ended(code) if code is not None else end
    return end


def _forkserved(process: BaseProcess) -> bool:
    return getattr(getattr(process, "_popen", None), "method", None) == "forkserver"


def _reap(process: BaseProcess, fd: int) -> Ended | None:
    with _REAP_LOCK:
        known = _known_code(process)
        if known is not None:
            return Ended(known)
        if fd < 0:
            return _ended_by_sentinel(process)
        if not _readable(fd):
            return None
        try:
            info = os.waitid(os.P_PIDFD, fd, os.WEXITED | os.WNOHANG)
        except ChildProcessError:
            return Ended(None)  # reaped by another handler (or the forkserver's child)
        if info is None:  # ended but not waitable (e.g. traced): the status is not ours
            return Ended(None)
        code = info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
        _tell_multiprocessing(process, code)
        return Ended(code)


def _ended_by_sentinel(process: BaseProcess) -> Ended | None:
    code = process.exitcode  # waitpid by pid: only where there is no pidfd
    if code is not None:
        return Ended(code)
    if not _readable(process.sentinel):
        return None
    # The sentinel reads EOF a moment before the process is waitable: give it that moment
    # (bounded, sleeping) before concluding that another handler reaped it.
    deadline = time.monotonic() + _WAITABLE_S
    while (code := process.exitcode) is None and time.monotonic() < deadline:
        time.sleep(0.005)
    return Ended(code)


def _known_code(process: BaseProcess) -> int | None:
    popen = getattr(process, "_popen", None)
    return getattr(popen, "returncode", None)


def _tell_multiprocessing(process: BaseProcess, code: int) -> None:
    popen = getattr(process, "_popen", None)
    if popen is not None:
        popen.returncode = code


def send_signal(process: BaseProcess, fd: int, sig: int) -> None:
    """Signal ``process`` unless it has ended: through its pidfd, so a freed pid is never hit."""
    try:
        if fd >= 0:
            signal.pidfd_send_signal(fd, sig)
        elif process.pid is not None and not has_ended(process, fd):
            os.kill(process.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def wait_ended(items: Sequence[tuple[BaseProcess, int]], timeout: float) -> None:
    """Block until one of ``(process, fd)`` may have ended, or ``timeout`` passed."""
    wait([fd if fd >= 0 else p.sentinel for p, fd in items], max(0.0, timeout))


def release(process: BaseProcess, fd: int) -> bool:
    """Close ``process`` (its sentinel and pipes) once it has ended; False while it runs.

    One reaped by another handler cannot be closed the usual way (multiprocessing thinks
    it runs): its descriptors are closed directly."""
    end = ended(process, fd)
    if end is None:
        return False
    if end.code is not None:
        process.close()
        return True
    popen = getattr(process, "_popen", None)
    if popen is not None:
        popen.close()
    return True
