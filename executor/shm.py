"""Anonymous shared-memory segments: never a name in /dev/shm, never a sparse page.

    driver: create(label, size) ─► memfd_create (CLOEXEC) ─► posix_fallocate ─► mmap
            handle() ─► SegmentFd ── fork: the fd number is inherited
                                 └─ spawn / forkserver: pickled as DupFd, rebuilt by detach()
    worker: attach(SegmentFd, size) ─► mmap ─► close the fd (the mapping keeps the memory)
    driver: close_fd() once every worker has started; close() unmaps

Invariants:
- Nothing is named in /dev/shm (Linux ``memfd_create``), so a driver SIGKILLed at any
  instant leaves nothing behind: the memory goes with the last fd or mapping.  Without
  memfd the fallback names a segment ``faultlab_<pid>_<random>_<label>`` and unlinks it
  right after opening it; ``sweep_stale`` removes one a SIGKILL left in that instant.
- Every page is allocated up front (``posix_fallocate``), so a lack of memory is a
  ``SharedMemoryError`` at creation naming the queue, the bytes needed and the bytes free,
  never a SIGBUS on a later write.  memfd memory is checked first against the machine's
  MemAvailable: allocating past it would wake the OOM killer rather than fail.
- Only processes being started get a segment's fd: pickling a ``SegmentFd`` anywhere else
  is refused.

``multiprocessing.shared_memory`` is not used: under Python 3.11 every process that attaches
registers the name with the resource tracker, and it names the segment in /dev/shm.
"""

from __future__ import annotations

import _posixshmem  # the stdlib's own thin shm_open/shm_unlink wrapper
import errno
import mmap
import os
import re
import secrets
from multiprocessing import context, reduction

import psutil

from executor.errors import SharedMemoryError

PREFIX = "faultlab_"
SHM_DIR = "/dev/shm"
MEMFD = hasattr(os, "memfd_create")  # False selects the named fallback (tests clear it)
_NAME_RE = re.compile(rf"^{PREFIX}(\d+)_")
_NO_SPACE = (errno.ENOSPC, errno.ENOMEM, errno.EFBIG)


class SegmentFd:
    """A segment's fd on its way to a child: inherited under fork, passed as DupFd otherwise."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        context.assert_spawning(self)  # only a child being started may receive it
        return (_rebuild_segment_fd, (reduction.DupFd(self.fd),))


def _rebuild_segment_fd(dup: object) -> SegmentFd:
    return SegmentFd(dup.detach())  # type: ignore[attr-defined]


class ShmSegment:
    """One mapped segment; ``buf`` is a writable memoryview over all of it."""

    def __init__(self, fd: int, size: int, label: str) -> None:
        """Map ``size`` bytes of ``fd``; the segment keeps ``fd`` open until ``close_fd``."""
        self._mmap = _map(fd, size, label)
        self.fd: int | None = fd
        self.label = label
        self.size = size
        self.buf = memoryview(self._mmap)

    @classmethod
    def create(cls, label: str, size: int) -> ShmSegment:
        """A new segment of ``size`` bytes, every page allocated; SharedMemoryError if there is no room."""
        fd, named = _open_anonymous(label)
        try:
            _allocate(fd, size, label, named)
            return cls(fd, size, label)
        except BaseException:
            os.close(fd)
            raise

    @classmethod
    def attach(cls, handle: SegmentFd, size: int, label: str) -> ShmSegment:
        """Map a segment the driver created; the fd is closed (the mapping keeps the memory)."""
        fd = handle.fd
        try:
            actual = os.fstat(fd).st_size
            if actual != size:
                raise ValueError(f"queue {label}: segment holds {actual} bytes, its spec {size}")
            segment = cls(fd, size, label)
        except BaseException:
            os.close(fd)
            raise
        segment.close_fd()
        return segment

    def handle(self) -> SegmentFd:
        assert self.fd is not None, "the segment's fd was already closed"
        return SegmentFd(self.fd)

    def close_fd(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def close(self) -> None:
        """Close the fd and drop this process's mapping; raises BufferError while views are alive."""
        self.close_fd()
        if self.buf is not None:
            self.buf.release()
            self.buf = None  # type: ignore[assignment]
            self._mmap.close()


def _open_anonymous(label: str) -> tuple[int, bool]:
    """An fd of a new, empty, nameless segment, and whether it came from the named fallback."""
    if MEMFD:
        return os.memfd_create(PREFIX + label, os.MFD_CLOEXEC), False
    name = f"{PREFIX}{os.getpid()}_{secrets.token_hex(4)}_{label}"
    fd = _posixshmem.shm_open("/" + name, os.O_RDWR | os.O_CREAT | os.O_EXCL, mode=0o600)
    unlink(name)  # the fd is all anyone needs: nothing to leak from here on
    return fd, True


def _allocate(fd: int, size: int, label: str, named: bool) -> None:
    free = _free_bytes(named)
    if not named and size > free:
        raise _no_space(label, size, free, named)
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno not in _NO_SPACE:
            raise
        raise _no_space(label, size, free, named) from exc


def _map(fd: int, size: int, label: str) -> mmap.mmap:
    """``mmap`` of the whole segment; no room in the address space (RLIMIT_AS, overcommit
    refused) is a ``SharedMemoryError`` naming the queue, like no room for its pages."""
    try:
        return mmap.mmap(fd, size)
    except OSError as exc:
        if exc.errno not in _NO_SPACE:
            raise
        error = SharedMemoryError(
            f"cannot map shared memory for queue {label}: it needs {size} bytes "
            f"({size / 2**20:.1f} MiB) of address space and mmap failed ({exc.strerror}); "
            "lower ExecutorConfig.n_chunks or chunk_bytes, or raise the address-space limit "
            "(ulimit -v)"
        )
        raise error from exc


def _no_space(label: str, size: int, free: int, named: bool) -> SharedMemoryError:
    where, hint = (
        (f"free in {SHM_DIR}", f"enlarge {SHM_DIR} (e.g. docker run --shm-size)")
        if named else ("of memory available", "free memory")
    )
    return SharedMemoryError(
        f"cannot allocate shared memory for queue {label}: it needs {size} bytes "
        f"({size / 2**20:.1f} MiB), {free} bytes ({free / 2**20:.1f} MiB) {where}; "
        f"lower ExecutorConfig.n_chunks or chunk_bytes, or {hint}"
    )


def _free_bytes(named: bool) -> int:
    """Bytes a new segment can take: /dev/shm's free space, or the machine's available memory."""
    if named:
        st = os.statvfs(SHM_DIR)
        return st.f_bavail * st.f_frsize
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise OSError("no MemAvailable in /proc/meminfo")


def unlink(name: str) -> bool:
    """Remove a name from /dev/shm; False when it was already gone."""
    try:
        _posixshmem.shm_unlink("/" + name)
    except FileNotFoundError:
        return False
    return True


def sweep_stale() -> list[str]:
    """Unlink faultlab segments whose owner process is dead; returns the names removed.

    Only the named fallback can leave one (a SIGKILL between its open and its unlink)."""
    removed: list[str] = []
    try:
        entries = os.listdir(SHM_DIR)
    except FileNotFoundError:
        return removed
    for entry in entries:
        match = _NAME_RE.match(entry)
        if match and not psutil.pid_exists(int(match.group(1))) and unlink(entry):
            removed.append(entry)
    return removed
