"""The exit guard: a tiny forked child that ends its worker when the driver goes, GIL or not.

    worker (main thread may sit in C code holding the GIL: sum(range(10**10)), a regex)
      │ fork, first thing in prepare_process
      ▼
    guard: PR_SET_PDEATHSIG=SIGKILL (it dies with the worker), keeps only two fds:
      poll(death pipe, worker pidfd)
        worker pidfd readable ─► the worker is gone: exit
        death pipe EOF (the driver died, or shut down) ─► wait grace on the worker pidfd
            ─► still there ─► pidfd_send_signal(SIGKILL) ─► exit

Why a process: the worker's own death-pipe watcher is a Python thread.  It asks the main
thread to leave (SIGTERM) and, after the grace, calls ``os._exit`` itself; both need the
GIL, so a main thread busy in GIL-holding C code kept the worker alive long after a
SIGKILLed driver (10 s and more).  The kernel's parent-death signal cannot do it alone: it
follows the thread that forked the worker (or the forkserver), not the driver process, so it
stays SIGCONT (executor/process_setup.py).  The guard has its own interpreter lock, touches
no lock it inherited (no logging, no imports after the fork), and signals through the pidfd,
so it can never hit a recycled pid.

Invariants:
- The guard never outlives its worker (parent-death signal SIGKILL, and the pidfd check),
  and it holds nothing the driver waits for: every inherited fd but its two is closed, so
  neither a reply pipe, the READY pipe nor a sentinel is kept open by it.
- It acts only on EOF of the death pipe, the same event the watcher thread acts on, after
  the same grace: an orderly worker exit is never cut short.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal

_PR_SET_PDEATHSIG = 1
GUARD_NAME = b"faultlab-guard"  # its comm (psutil's name()), so tools can tell it from its worker
_PR_SET_NAME = 15


GRACE_AFTER_WATCHER_S = 0.01  # the watcher thread's own os._exit goes first when it can


def start_guard(death_fd: int, grace_s: float) -> int:
    """Fork the guard of this process (single-threaded still); its pid, or 0 where pidfds
    are missing (then the watcher thread alone ends the worker)."""
    if not hasattr(os, "pidfd_open") or not hasattr(signal, "pidfd_send_signal"):
        return 0
    try:
        libc = ctypes.CDLL(None)  # loaded before the fork: the guard takes no loader lock
    except OSError:
        return 0
    worker = os.pidfd_open(os.getpid())
    try:
        pid = os.fork()
        if pid == 0:
            _guard(libc, death_fd, worker, grace_s + GRACE_AFTER_WATCHER_S)  # never returns
    finally:
        os.close(worker)
    return pid


def _guard(libc: ctypes.CDLL, death_fd: int, worker: int, grace_s: float) -> None:
    code = 0
    try:
        _become_guard(libc, death_fd, worker)
        _watch(death_fd, worker, grace_s)
    except BaseException:  # noqa: BLE001 - nothing may unwind into the worker's copied frames
        code = 1
    os._exit(code)


def _become_guard(libc: ctypes.CDLL, death_fd: int, worker: int) -> None:
    libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    libc.prctl(_PR_SET_NAME, ctypes.c_char_p(GUARD_NAME), 0, 0, 0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is for the driver
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    low, high = sorted((death_fd, worker))
    os.closerange(0, low)
    os.closerange(low + 1, high)
    os.closerange(high + 1, 1 << 20)


def _watch(death_fd: int, worker: int, grace_s: float) -> None:
    poller = select.poll()
    poller.register(death_fd, select.POLLIN)
    poller.register(worker, select.POLLIN)
    while True:
        fired = {fd for fd, _ in poller.poll()}
        if worker in fired:
            return  # the worker is gone (before the parent-death signal got here)
        if death_fd in fired and not _read_some(death_fd):
            break  # EOF: the driver is gone or wants us gone
    wait = select.poll()
    wait.register(worker, select.POLLIN)
    if not wait.poll(max(1, int(grace_s * 1000))):
        signal.pidfd_send_signal(worker, signal.SIGKILL)


def _read_some(fd: int) -> bool:
    """Read what the pipe holds; False at EOF."""
    try:
        return bool(os.read(fd, 4096))
    except BlockingIOError:
        return True
    except OSError:
        return False
