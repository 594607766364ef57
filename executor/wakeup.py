"""A wake-up pipe: one byte written wakes every ``select`` on its read end.

    waker ── wake() ──► [pipe] ──► readable read end ──► a waiting thread returns from select

The byte is never drained by the pipe itself (whoever owns it decides), so a wake-up that
happens before anyone waits is not lost.  ``wake()`` after ``close()`` does nothing: a
closed fd number may already belong to something else, so writing to it would hit an
unrelated file.  The executor's cancel pipe, the monitor's and the TCP hub's stop pipes
are each one of these (CPython's concurrent.futures has the same idea, ``_ThreadWakeup``).
"""

from __future__ import annotations

import os
import threading


class WakeupPipe:
    def __init__(self) -> None:
        self.r, self._w = os.pipe()
        self._lock = threading.Lock()
        self._closed = False  # guarded by _lock: never write to a recycled fd number

    def fileno(self) -> int:
        return self.r

    def wake(self) -> None:
        with self._lock:
            if not self._closed:
                os.write(self._w, b"\1")

    def close(self) -> None:
        """Close both ends; idempotent."""
        with self._lock:
            if not self._closed:
                self._closed = True
                os.close(self.r)
                os.close(self._w)
