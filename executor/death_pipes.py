"""What a process forked from the driver must not keep: death-pipe write ends and workers.

A worker learns that its driver is gone when its death pipe reaches EOF, which happens only
once every copy of the write end is closed.  ``fork`` copies all of the driver's fds into
the child, including the write ends of *other* executors in the same driver; a worker that
kept one would hold that executor's workers alive after its shutdown (until SIGTERM).  The
driver registers each write end here while it is open; a forked child drops them all
first thing (the registry itself is copied into the child by the fork).

Any ``os.fork()`` child does this (``os.register_at_fork``), not only our workers: a helper
the user's program forks would otherwise keep every worker alive after the driver died,
and make ``shutdown()`` wait out its grace.  Exec'd children never get them (pipes are not
inheritable).  A write end is dropped by pointing its fd number at /dev/null, not by
closing it: the child still holds the ``Connection`` object, whose eventual close must not
close an unrelated fd that reused the number.
"""

from __future__ import annotations

import os
import threading

_lock = threading.Lock()
_writers: set[int] = set()


def register(fd: int) -> None:
    with _lock:
        _writers.add(fd)


def unregister(fd: int) -> None:
    with _lock:
        _writers.discard(fd)


def close_inherited() -> None:
    """In a forked child: drop every write end the driver had open at the fork."""
    if _writers:
        null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        try:
            for fd in list(_writers):
                try:
                    os.dup2(null, fd, inheritable=False)
                except OSError:
                    pass
        finally:
            os.close(null)
    _writers.clear()


def _after_fork_in_child() -> None:
    close_inherited()  # looked up at each fork: chaos's broken executors replace it


os.register_at_fork(after_in_child=_after_fork_in_child)
