"""How the observer of a target run holds on: it ends cleanly whatever ends it, and it keeps
time on a loaded machine.

    with unwinding() as guard:            SIGHUP, SIGTERM, SIGINT, SIGQUIT (a closed terminal,
        observe ...                       a kill, Ctrl-C) raise SystemExit(128 + signum) in
        with guard.shielded():            the observer's main thread: the run unwinds to its
            take the run down             clean-up; a signal during the clean-up is kept, not
    guard.signum ──► the run re-raises    raised, so the clean-up always finishes (resume what
                     once its record is   it stopped, SIGKILL the run's tree); the run then
                     written              writes its record and re-raises
    with realtime() as how:               the calling thread at SCHED_FIFO, so the observer
        observe ...                       reads events and fires faults on time beside a CPU
                                          hog; SCHED_RESET_ON_FORK: the driver and every other
                                          child or thread starts as an ordinary task (the target
                                          is never sped up).  ``how`` says what was had, in one
                                          line ("SCHED_FIFO 10", or why not)

Invariants: handlers are installed only in the main thread (elsewhere the guard is inert and
says so in ``guard.installed``) and restored on leaving; the scheduling policy is restored on
leaving.  A SIGKILL of the observer cannot be caught: its run's processes (in a session of
their own) then stay, a stopped one stopped; nothing inside the observer can help that.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from types import FrameType

UNWIND_SIGNALS = (signal.SIGHUP, signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)
REALTIME_PRIORITY = 10  # above every ordinary task, below the kernel's own RT threads (50+)


class Unwinding:
    """The signal that ends the observer, once it came (``signum``)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.installed = False
        self._shielded = False

    def handle(self, signum: int, frame: FrameType | None) -> None:
        first = self.signum is None
        if first:
            self.signum = signum
        if first and not self._shielded:
            raise SystemExit(128 + signum)

    @property
    def name(self) -> str | None:
        return None if self.signum is None else signal.Signals(self.signum).name

    @contextlib.contextmanager
    def shielded(self) -> Iterator[None]:
        """A signal in here is kept for later: the clean-up inside is never cut short."""
        self._shielded = True
        try:
            yield
        finally:
            self._shielded = False


@contextlib.contextmanager
def unwinding() -> Iterator[Unwinding]:
    guard = Unwinding()
    if threading.current_thread() is not threading.main_thread():
        yield guard
        return
    previous = {s: signal.signal(s, guard.handle) for s in UNWIND_SIGNALS}
    guard.installed = True
    try:
        yield guard
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@contextlib.contextmanager
def realtime(priority: int = REALTIME_PRIORITY) -> Iterator[str]:
    """The calling thread at SCHED_FIFO ``priority`` while inside (see the module docstring)."""
    try:
        policy, param = os.sched_getscheduler(0), os.sched_getparam(0)
        os.sched_setscheduler(0, os.SCHED_FIFO | os.SCHED_RESET_ON_FORK,
                              os.sched_param(priority))
    except OSError as exc:  # not root, or a container without CAP_SYS_NICE
        yield f"ordinary scheduling (no SCHED_FIFO: {exc.strerror or exc})"
        return
    try:
        yield f"SCHED_FIFO {priority}"
    finally:
        os.sched_setscheduler(0, policy, param)
