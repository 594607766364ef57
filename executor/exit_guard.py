"""The exit guard: a tiny forked child that ends its worker when the driver goes, GIL or not.

    worker (main thread may sit in C code holding the GIL: sum(range(10**10)), a regex)
      │ fork, first thing in prepare_process
      ▼
    guard: PR_SET_PDEATHSIG=SIGKILL (it dies with the worker), keeps only two fds:
      poll(death pipe, worker pidfd)
        worker pidfd readable ─► the worker is gone: exit
        death pipe EOF ─► poll(worker pidfd, driver pidfd)
            the driver is alive: an orderly shutdown, whose own escalation (grace, SIGTERM,
                SIGKILL) ends the worker ─► wait (the driver may still die meanwhile)
            the driver is gone ─► wait grace on the worker pidfd
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
- It acts only once the driver is gone (EOF of the death pipe and the driver's pidfd
  readable), after the watcher thread's grace: an orderly exit is never cut short, and a
  shutdown's own escalation stays the driver's (a worker that ignores SIGTERM is still
  the driver's to SIGKILL, and a driver that never does is still caught).
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


def start_guard(death_fd: int, grace_s: float, driver_pid: int) -> int:
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
        driver = os.pidfd_open(driver_pid)
    except OSError:
        driver = -1  # already gone
    try:
        pid = os.fork()
        if pid == 0:
            _guard(libc, death_fd, worker, driver, grace_s + GRACE_AFTER_WATCHER_S)  # no return
    finally:
        os.close(worker)
        if driver >= 0:
            os.close(driver)
    return pid


def _guard(libc: ctypes.CDLL, death_fd: int, worker: int, driver: int, grace_s: float) -> None:
    code = 0
    try:
        _become_guard(libc, (death_fd, worker, driver))
        _watch(death_fd, worker, driver, grace_s)
    except BaseException:  # noqa: BLE001 - nothing may unwind into the worker's copied frames
        code = 1
    os._exit(code)


def _become_guard(libc: ctypes.CDLL, keep: tuple[int, ...]) -> None:
    libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    libc.prctl(_PR_SET_NAME, ctypes.c_char_p(GUARD_NAME), 0, 0, 0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is for the driver
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    start = 0
    for fd in sorted(fd for fd in keep if fd >= 0):  # close every inherited fd but ours
        os.closerange(start, fd)
        start = fd + 1
    os.closerange(start, 1 << 20)


def _watch(death_fd: int, worker: int, driver: int, grace_s: float) -> None:
    poller = select.poll()
    poller.register(death_fd, select.POLLIN)
    poller.register(worker, select.POLLIN)
    while True:
        fired = {fd for fd, _ in poller.poll()}
        if worker in fired:
            return  # the worker is gone (before the parent-death signal got here)
        if death_fd in fired and not _read_some(death_fd):
            break  # EOF: the driver is gone or wants us gone
    if driver >= 0:  # an orderly shutdown is the driver's to finish, unless it dies
        either = select.poll()
        either.register(worker, select.POLLIN)
        either.register(driver, select.POLLIN)
        if worker in {fd for fd, _ in either.poll()}:
            return
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
