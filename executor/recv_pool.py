"""Receive buffers the executor owns, reused so that large replies do not pay page faults.

    frame_layout ──take(n)──► Loan (ctypes view of a region) ──► memoryview ──► reader fills it
         ▲                        │ numpy array / tensor rebuilt on it (its base chain
         │                        │ ends at the Loan), handed to the caller
         │                        ▼ last array, tensor or view of it dies → Loan dies
    free lists ◄── drained in take() ◄── returned (deque) ◄── weakref callback of the Loan

Array and tensor data of at least ``POOLED_MIN`` bytes arriving over the shared-memory queue
is copied (once) into a region from this pool instead of a fresh ``bytearray``.  A fresh
32 MiB buffer is an mmap by glibc (above its mmap threshold) and costs ~8k page faults each
time, a cold 1-8 MiB one as many per page; a region that comes back is already mapped.  The
user's process keeps its allocator settings: only memory the executor owns is reused.

Regions are private anonymous mappings (``MAP_PRIVATE``: a fork child gets a copy-on-write
copy, never an alias of the parent's arrays) in power-of-two size classes (no huge pages:
see ``HUGE_PAGES``).  A loan is a
ctypes array laid over a region (``from_buffer``), so every buffer export derived from it —
a memoryview, its slices and casts, numpy's base, a tensor's storage — keeps the loan alive,
and the region stays mapped while anything uses it (the loan holds an export of the mmap).

Invariants:
- A region is in at most one place: lent (exactly one live Loan lies over it), in
  ``_returned``, or in a free list.  It is lent again only after its Loan died, i.e. after
  the last object that could read or write it is gone.
- The weakref callback only appends to ``_returned`` (a deque: atomic, no lock), because it
  may run anywhere — in GC inside ``take`` on the same thread, or on another thread;
  ``take`` moves returned regions to the free lists under ``_lock``.
- At most ``KEEP_PER_CLASS`` free regions per size class and ``KEEP_BYTES`` free in total
  (256 MiB: eight 32 MiB tensors); a region beyond that is dropped and unmapped when its
  last reference goes (never ``close()``d: a dying loan may still hold its export).
- An interrupt (KeyboardInterrupt in the driver) inside ``take`` can only lose a region
  (unmapped once unreferenced), never lend one twice: a region leaves the free list before
  its loan exists and returns only through that loan's callback.
- The pool keeps memory only while an executor of this process (or this worker process)
  is alive: when the last one shuts down it drops its free regions, and loans that die
  later are unmapped, not kept (``open_user`` / ``close_user``).
- A fork child starts with an empty pool and no users (``os.register_at_fork``); loans it
  inherited come back to its own pool, over its own private copies, once it has a user.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import threading
import weakref
from collections import deque
from typing import Any

POOLED_MIN = 1 << 20  # smaller buffers come from the allocator (below glibc's mmap threshold)
KEEP_PER_CLASS = 4  # free regions kept per size class: two calls to 2 workers (a caller that
# keeps the last reply while it makes the next call needs 2 + 2; measured: with 2, every
# other 32 MiB echo in the bench mapped a fresh region, 8k faults)
KEEP_BYTES = 256 << 20  # free bytes kept in all
# Ask for transparent huge pages on new regions?  Off: measured on this VM, a fresh 32 MiB
# pair then costs ~40 faults but 12-15 ms or 120-210 ms (bimodal, no compaction stalls: the
# host backing fresh 2 MiB pages), against a steady 32-44 ms with 4 KiB pages.
HUGE_PAGES = False


def size_class(n: int) -> int:
    """The region size a loan of ``n`` bytes comes from: the next power of two."""
    return 1 << (n - 1).bit_length()


class _Region:
    """A private anonymous mapping of one size class."""

    __slots__ = ("mm", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self.mm = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        if HUGE_PAGES and size >= 2 << 20 and hasattr(mmap, "MADV_HUGEPAGE"):
            try:
                self.mm.madvise(mmap.MADV_HUGEPAGE)
            except OSError:  # no transparent huge pages here: 4 KiB pages still work
                pass


class RecvPool:
    """Size-classed free lists of regions; ``take`` lends a writable view of one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards _free and _free_bytes
        self._free: dict[int, list[_Region]] = {}
        self._free_bytes = 0
        self._returned: deque[_Region] = deque()  # appended by loan callbacks only
        # Each loan's weakref (so that its callback runs), by id: a ctypes array is unhashable.
        self._refs: dict[int, weakref.ref[Any]] = {}
        self.created = 0  # regions mapped so far (for tests and benchmarks)
        self._users = 0  # live executors (and worker processes) in this process

    def take(self, n: int) -> memoryview:
        """A writable ``n``-byte view of a region no live object uses; it returns to the
        pool when the last object derived from the view (array, tensor, slice) dies."""
        size = size_class(n)
        with self._lock:
            self._drain()
            free = self._free.get(size)
            region = free.pop() if free else None
            if region is not None:
                self._free_bytes -= size
        if region is None:
            region = _Region(size)
            self.created += 1
        loan = (ctypes.c_char * size).from_buffer(region.mm)
        ref = weakref.ref(loan, self._callback(region))
        self._refs[id(ref)] = ref
        return memoryview(loan).cast("B")[:n]

    def _callback(self, region: _Region) -> Any:
        def gone(ref: weakref.ref[Any]) -> None:
            self._refs.pop(id(ref), None)
            if self._users:  # else nobody will take it: unmapped once unreferenced
                self._returned.append(region)

        return gone

    def _drain(self) -> None:
        """Move returned regions to the free lists, within the bounds (``_lock`` held)."""
        while self._returned:
            region = self._returned.popleft()
            free = self._free.setdefault(region.size, [])
            if len(free) < KEEP_PER_CLASS and self._free_bytes + region.size <= KEEP_BYTES:
                free.append(region)
                self._free_bytes += region.size

    def free_bytes(self) -> int:
        """Bytes held in free regions now (returned loans included once drained)."""
        with self._lock:
            self._drain()
            return self._free_bytes

    def open_user(self) -> None:
        """An executor (or a worker process) starts using the pool."""
        with self._lock:
            self._users += 1

    def close_user(self) -> None:
        """An executor is done; once none is left, the pool holds no memory: free regions
        are dropped now, lent ones when their last view dies (a callback racing this may
        leave one region in ``_returned``, dropped by the next user's first ``take``)."""
        with self._lock:
            self._users = max(0, self._users - 1)
            if not self._users:
                self._free, self._free_bytes = {}, 0
                self._returned.clear()

    def clear(self) -> None:
        """Forget every free region and user (a fork child's pool starts empty: the
        parent's executors are not the child's)."""
        self._lock = threading.Lock()  # the parent may have held it at the fork
        self._free, self._free_bytes, self._users = {}, 0, 0
        self._returned.clear()


pool = RecvPool()
os.register_at_fork(after_in_child=pool.clear)
