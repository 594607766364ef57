"""Named POSIX shared-memory segments, without multiprocessing's resource tracker.

Every segment is named ``faultlab_<owner pid>_<executor token>_<role>`` so that:

- the executor unlinks the name as soon as every process has mapped it (the memory lives
  on until the last mapping goes), hence ``/dev/shm`` holds nothing while it runs;
- a segment left by an owner that was SIGKILLed during start-up can be recognised and
  swept by the next executor (``sweep_stale``): its owner pid is no longer alive.

``multiprocessing.shared_memory`` is not used because under Python 3.11 every process that
merely attaches registers the name with the resource tracker, which then unlinks it (with
warnings) when that process exits, and starting the tracker adds a process of its own.
"""

from __future__ import annotations

import _posixshmem  # the stdlib's own thin shm_open/shm_unlink wrapper
import mmap
import os
import re

PREFIX = "faultlab_"
SHM_DIR = "/dev/shm"
_NAME_RE = re.compile(rf"^{PREFIX}(\d+)_")


class ShmSegment:
    """One mapped segment; ``buf`` is a writable memoryview over all of it."""

    def __init__(self, name: str, size: int, *, create: bool) -> None:
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = _posixshmem.shm_open("/" + name, flags, mode=0o600)
        try:
            if create:
                os.ftruncate(fd, size)
            else:
                size = os.fstat(fd).st_size
            self._mmap = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.name = name
        self.size = size
        self.buf = memoryview(self._mmap)

    def unlink(self) -> None:
        unlink(self.name)

    def close(self) -> None:
        """Drop this process's mapping; raises BufferError while views of it are alive."""
        if self.buf is not None:
            self.buf.release()
            self.buf = None  # type: ignore[assignment]
            self._mmap.close()


def unlink(name: str) -> bool:
    """Remove a name from /dev/shm; False when it was already gone."""
    try:
        _posixshmem.shm_unlink("/" + name)
    except FileNotFoundError:
        return False
    return True


def segment_name(token: str, role: str) -> str:
    return f"{PREFIX}{os.getpid()}_{token}_{role}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale() -> list[str]:
    """Unlink faultlab segments whose owner process is dead; returns the names removed."""
    removed: list[str] = []
    try:
        entries = os.listdir(SHM_DIR)
    except FileNotFoundError:
        return removed
    for entry in entries:
        match = _NAME_RE.match(entry)
        if match and not _pid_alive(int(match.group(1))) and unlink(entry):
            removed.append(entry)
    return removed
