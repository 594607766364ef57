"""The worker monitor: one thread that turns an unexpected worker exit into a failure.

    wait(exit fd 0 … exit fd N-1, stop pipe) ──► one fired ──► on_death(rank, pid, exitcode, t)
                                                └─► stop pipe readable ──► return (shutdown)

An exit fd is a pidfd (readable when the process exits, whatever its children inherited),
or the multiprocessing sentinel where pidfds are missing.  The exit code comes from the
pidfd too (executor/exits.py): ``exitcode`` None means the worker ended but another handler
reaped it first (SIGCHLD ignored, or a caller's SIGCHLD handler), never "still running".

The monitor holds no reference to the executor, only the callback, so an executor that is
dropped can still be garbage-collected (and shut down by its finalizer).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess

from executor import exits
from executor.wakeup import WakeupPipe

DeathCallback = Callable[[int, int, int | None, int], None]


class WorkerMonitor(threading.Thread):
    def __init__(
        self, processes: Sequence[tuple[int, BaseProcess, int]], on_death: DeathCallback
    ) -> None:
        super().__init__(name="faultlab-monitor", daemon=True)
        self._processes = list(processes)
        self._on_death = on_death
        self._stop_pipe = WakeupPipe()

    def stop(self) -> None:
        """Make the thread return without reporting anything; safe to call any time."""
        self._stop_pipe.wake()

    def run(self) -> None:
        try:
            by_fd = {fd: (rank, p) for rank, p, fd in self._processes}
            ready = wait([*by_fd, self._stop_pipe.r])
            detected_ns = time.time_ns()
            if self._stop_pipe.r in ready:
                return
            fd = min((s for s in ready if s in by_fd), key=lambda s: by_fd[s][0])
            rank, process = by_fd[fd]
            end = exits.ended(process, fd)  # it fired, so it has ended: reap it
            self._on_death(rank, process.pid or 0, None if end is None else end.code, detected_ns)
        except BaseException:
            logging.getLogger("executor").exception("worker monitor failed")
        finally:
            self.close()

    def close(self) -> None:
        """Release the stop pipe (the thread does it when it returns); idempotent."""
        self._stop_pipe.close()
