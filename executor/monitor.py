"""The worker monitor: one thread that turns an unexpected worker exit into a failure.

    wait(exit fd 0 … exit fd N-1, stop pipe) ──► one fired ──► on_death(rank, pid, exitcode, t)

An exit fd is a pidfd (readable when the process exits, whatever its children inherited),
or the multiprocessing sentinel where pidfds are missing.
                                                └─► stop pipe readable ──► return (shutdown)

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
            by_sentinel = {fd: (rank, p) for rank, p, fd in self._processes}
            ready = wait([*by_sentinel, self._stop_pipe.r])
            detected_ns = time.time_ns()
            if self._stop_pipe.r in ready:
                return
            rank, process = min(by_sentinel[s] for s in ready if s in by_sentinel)
            process.join(1.0)  # reap, so the exit code is known
            self._on_death(rank, process.pid or 0, process.exitcode, detected_ns)
        except BaseException:
            logging.getLogger("executor").exception("worker monitor failed")
        finally:
            self.close()

    def close(self) -> None:
        """Release the stop pipe (the thread does it when it returns); idempotent."""
        self._stop_pipe.close()
