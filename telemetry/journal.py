"""The span journal: fixed-size binary records in a per-process, append-only mmap'd file.

Data flow::

    hot path (any thread)                       page cache            reader (any process)
    JournalWriter.append(packer, kind, ...)  ──►  journal-*.bin   ──►  find_journals + pread
      next(slots) -> slot                         (mmap; outlives      -> assemble.JournalDecoder
      packer(mm, offset + 1, ...)                  SIGKILL)
      mm[offset] = kind  (commit mark)

``append`` is the general record writer; every record format (the ``*_S`` structs and
their constants) is defined here, and ``assemble`` decodes with the same structs.  The four
records of a traced RPC's common case (``Recorder.begin_rpc``, ``serve``, ``served`` and
``rpc_trace.end_rpc``) repeat ``append``'s three steps inline: in a running executor (three
processes on two cores, every cache cold) one more call per record cost ~0.8 µs per RPC
(bench/bench_rpc_tracing.py, bench/RESULTS.md).  A test holds every writer to the steps
and their order, and names the writers.

File layout: a ``HEADER_SIZE`` header (magic, version, pid, rank, role, service, created
time, an incarnation id, the segment size) followed by ``1 << segment_bits`` slots of
``RECORD_SIZE`` bytes.  When a segment fills, the writer opens the next segment file of the
same incarnation and lets go of the one before the full one.  Segments are 4 MiB of records unless
``FAULTLAB_JOURNAL_SEGMENT_BYTES`` (read once, at import) names another power of two; the
header records the size, so readers never depend on the writer's environment.

Invariants:

- A slot is reserved by ``next(itertools.count)``, which is atomic under the GIL, so
  threads never share a slot (``close`` learns how many were used the same way).  Records
  of one span are written by one thread in order, so their slot indices are increasing.
- A record's first byte (its kind) is stored *after* the rest of the record: a slot whose
  kind byte is 0 is either unwritten or torn by a kill in mid-write, and readers skip it.
  (The writer's stores land in the shared page cache in program order on one CPU.)
- A string is written (as one or more STRING records) before any record that names its id.
- Writes are plain memory stores: no syscall, no flush.  The kernel keeps the pages of a
  killed process, which is the whole crash-safety story.
- Every segment's blocks are allocated (``posix_fallocate``) before it is mapped, so a
  store never faults for lack of space (a sparse file on a full filesystem means SIGBUS).
  When a segment cannot be created, the writer stops for good: one warning per process
  names the path and the bytes needed and free, every later write is a no-op, and the
  owner's ``on_stop`` callback drops the writer.
- Whatever the run's length, the writer holds at most two mappings (the newest segment
  and the one filled before it) and one fd per mapping (the mapping's own duplicate; the
  file's fd is closed as soon as it is mapped).  When segment N opens, segment N-2 is
  released: its ``maps`` entry becomes ``_RELEASED`` (a closed mapping, so a store into it
  raises ValueError, which every writer catches) and it is unmapped once no thread holds a
  reference.  ``maps`` is replaced, never changed in place, so a thread that fetched it
  keeps live mappings; a record is lost (it reads as torn) only if its thread stopped
  between reserving the slot and fetching ``maps`` while other threads filled a whole
  segment.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import mmap
import os
import re
import struct
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

MAGIC = b"FLJRNL01"
VERSION = 1
HEADER_SIZE = 256
RECORD_SIZE = 64
SEGMENT_ENV = "FAULTLAB_JOURNAL_SEGMENT_BYTES"
LEGACY_SEGMENT_BITS = 16  # 4 MiB of records: journals whose header names no size
_MIN_SEGMENT_BITS, _MAX_SEGMENT_BITS = 6, 24  # 4 KiB .. 1 GiB of records


def _segment_bits(raw: str | None) -> int:
    """Slot bits for ``FAULTLAB_JOURNAL_SEGMENT_BYTES``; a warning and the default if bad."""
    if raw is None or raw.strip() == "":
        return LEGACY_SEGMENT_BITS
    try:
        slots, rest = divmod(int(raw), RECORD_SIZE)
    except ValueError:
        slots, rest = 0, 1
    bits = slots.bit_length() - 1
    if rest or slots < 1 or slots != 1 << bits or not _MIN_SEGMENT_BITS <= bits <= _MAX_SEGMENT_BITS:
        log.warning("%s=%r is not a power of two between %d and %d bytes; using %d",
                    SEGMENT_ENV, raw, RECORD_SIZE << _MIN_SEGMENT_BITS,
                    RECORD_SIZE << _MAX_SEGMENT_BITS, RECORD_SIZE << LEGACY_SEGMENT_BITS)
        return LEGACY_SEGMENT_BITS
    return bits


# This process's segment size (``JournalWriter.append`` reads these module globals).
SEGMENT_BITS = _segment_bits(os.environ.get(SEGMENT_ENV))
SLOTS_PER_SEGMENT = 1 << SEGMENT_BITS
SLOT_MASK = SLOTS_PER_SEGMENT - 1
RECORD_SHIFT = RECORD_SIZE.bit_length() - 1  # offset of slot i: HEADER_SIZE + (i << shift)
assert 1 << RECORD_SHIFT == RECORD_SIZE
NO_RANK = -1

# Record kinds (first byte of a slot).
SPAN_START = 1
SPAN_END = 2
ATTRIBUTE = 3
EVENT = 4
STRING = 5
THREAD = 6
PHASES = 7  # an RPC's phase timestamps, expanded into child spans when read
KINDS = (SPAN_START, SPAN_END, ATTRIBUTE, EVENT, STRING, THREAD, PHASES)

# SPAN_END flags (SPAN_START writes no flags: only sampled spans are written at all).
FLAG_POINT = 0x02  # a zero-length span written by Recorder.event()
# SPAN_START flag: an RPC span; its last field is rpc id << TID_BITS | thread id, so the rpc
# id is known even when the driver dies before the call ends.
FLAG_RPC = 0x04
TID_BITS = 24  # Linux thread ids are below 2**22 (PID_MAX_LIMIT)
RPC_ID_LIMIT = 1 << (64 - TID_BITS)  # rpc ids a start record can carry (larger: PH_SENT)

# SPAN_END status codes (OpenTelemetry StatusCode values).
STATUS_UNSET, STATUS_OK, STATUS_ERROR = 0, 1, 2

# ATTRIBUTE value types and owners.
VT_STR, VT_INT, VT_FLOAT, VT_BOOL, VT_JSON = 1, 2, 3, 4, 5
OWNER_SPAN, OWNER_EVENT = 0, 1

# Structs pack a record *after* its kind byte (offset + 1): flags, small, id, then payload.
# The writer stores the kind byte last, as the commit mark.
_HEAD = "<BHI"
SPAN_START_S = struct.Struct(_HEAD + "QQQQQQ")  # trace_hi, trace_lo, span, parent, start, tid
_M64 = (1 << 64) - 1


def split_trace_id(trace_id: int) -> tuple[int, int]:
    """A 128-bit W3C trace id as the (high, low) 64-bit halves that records and the
    request header (``executor.serialization.TRACE_HEADER``) carry."""
    return trace_id >> 64, trace_id & _M64


def join_trace_id(hi: int, lo: int) -> int:
    """Inverse of ``split_trace_id``."""
    return hi << 64 | lo
SPAN_END_S = struct.Struct(_HEAD + "QQ")  # span_id, end_ns
ATTR_INT_S = struct.Struct(_HEAD + "Qq")  # owner, value (ints, bools, string ids)
ATTR_FLOAT_S = struct.Struct(_HEAD + "Qd")  # owner, value
EVENT_S = struct.Struct(_HEAD + "QQQ")  # span_id, time_ns, event seq (owner of its attrs)
STRING_S = struct.Struct(_HEAD + "I52s")  # total length, chunk bytes (small = chunk no.)
STRING_CHUNK = 52
THREAD_S = struct.Struct(_HEAD + "Q")  # id = thread name string id; native thread id
MAX_STRING = 8192  # longer strings are cut, so one string never floods the journal

# PHASES records: one per RPC phase group instead of a start, an end and attributes per
# child span.  ``small`` names the layout; the span id is the RPC (or execute) span's, whose
# SPAN_START was written when it began, so a process that dies mid-RPC leaves that span
# open (truncated) exactly as a classic span.  ``assemble`` expands them (``phases``).
PH_SENT = 1  # driver, request written: flags PH_*, the enqueue times and the RPC's facts
PH_SENT_S = struct.Struct(_HEAD + "QQQqqdq")  # span, enqueue start, end, rpc id, body size,
#                                               timeout s, reply rank
PH_NON_BLOCK, PH_TIMEOUT, PH_REPLY_RANK = 0x01, 0x02, 0x04
PH_DEQUEUED = 2  # driver, replies read: id = first rank; (start, end) of 3 ranks, 0: none
PH_SERVED = 3  # worker, reply sent: ENDS the span; flags = status, id = message string id
PH_TIMES_S = struct.Struct(_HEAD + "Q6Q")  # span, six times (ns); unused ones are 0
PH_DEQUEUE_RANKS = 3
PH_DONE = 4  # driver, last replies read: as PH_DEQUEUED, and ENDS the span (flags = status)
#              at its latest time: a successful RPC costs no SPAN_END record
PH_CALL = 5  # driver, a successful call to ranks 0 and 1 without timeout or reply rank: all
#              of PH_SENT and PH_DONE in one PH_TIMES_S record, written when the last reply
#              was read; ENDS the span (status OK) then.  flags = PH_NON_BLOCK, id = body size
#              (capped at 2**32 - 1); times: enqueue start, end, then rank 0's and rank 1's
#              dequeue start, end.  The rpc id is in the span's start record (FLAG_RPC).
MAX_PH_SIZE = (1 << 32) - 1
# PH_SERVED times: queue wait start, message in hand, unpickled, executed (the span's end),
# reply start (0: no reply), reply written.

# magic, version, pid, rank, created, incarnation, role, service, export owner's pid,
# segment bits (0 in journals written before the size was configurable: LEGACY_SEGMENT_BITS)
HEADER_S = struct.Struct("<8sIiiQQ32s64siB64s")  # ... segment bits, host name


@dataclasses.dataclass(frozen=True)
class JournalHeader:
    """Who wrote a journal: one process incarnation (a pid may be reused, an incarnation not)."""

    pid: int
    rank: int | None
    role: str
    service: str
    created_ns: int
    incarnation: int
    owner_pid: int = 0  # the driver whose live export ships this journal (0: none)
    segment_bits: int = SEGMENT_BITS  # each segment holds 1 << segment_bits slots
    host: str = ""  # host.name, taken when the journal is created ("" in older journals)

    @property
    def segment_bytes(self) -> int:
        """Size of one segment file: the header and every slot."""
        return HEADER_SIZE + (RECORD_SIZE << self.segment_bits)

    def pack(self) -> bytes:
        rank = NO_RANK if self.rank is None else self.rank
        return HEADER_S.pack(
            MAGIC, VERSION, self.pid, rank, self.created_ns, self.incarnation,
            self.role.encode()[:32], self.service.encode()[:64], self.owner_pid,
            self.segment_bits, self.host.encode()[:64],
        )

    @classmethod
    def unpack(cls, raw: bytes) -> JournalHeader:
        (magic, version, pid, rank, created, inc, role, service, owner,
         bits, host) = HEADER_S.unpack_from(raw)
        if magic != MAGIC or version != VERSION:
            raise ValueError(f"not a faultlab journal (magic {magic!r}, version {version})")
        bits = bits or LEGACY_SEGMENT_BITS
        if not _MIN_SEGMENT_BITS <= bits <= _MAX_SEGMENT_BITS:
            raise ValueError(f"not a faultlab journal (segment bits {bits})")
        return cls(
            pid=pid, rank=None if rank == NO_RANK else rank,
            role=role.rstrip(b"\0").decode(), service=service.rstrip(b"\0").decode(),
            created_ns=created, incarnation=inc, owner_pid=owner, segment_bits=bits,
            host=host.rstrip(b"\0").decode(errors="replace"),
        )


def segment_path(run_dir: Path, header: JournalHeader, segment: int) -> Path:
    rank = "x" if header.rank is None else str(header.rank)
    suffix = "" if segment == 0 else f".s{segment}"
    stem = f"journal-{header.role}-{rank}-{header.pid}-{header.incarnation:016x}"
    return run_dir / f"{stem}{suffix}.bin"


_SEGMENT_RE = re.compile(r"^(journal-.+-[0-9a-f]{16})(?:\.s(\d+))?\.bin$")


# What a write into a journal raises once it is closed (ValueError), released (IndexError,
# ValueError) or stopped (OSError, ``JournalStopped``): every writer catches these.
JOURNAL_ERRORS = (ValueError, IndexError, OSError)


class JournalStopped(OSError):
    """The journal could not create its next segment and has stopped (already warned)."""


class JournalWriter:
    """Appends records for one process incarnation; cheap enough for the hot path.

    ``on_stop(writer)`` is called once, from the writing thread, when a segment cannot be
    created after the first: the owner drops the writer so later spans cost nothing.
    """

    def __init__(self, run_dir: Path, header: JournalHeader,
                 on_stop: Callable[[JournalWriter], None] | None = None) -> None:
        if header.segment_bits != SEGMENT_BITS:
            raise ValueError(f"this process writes {SEGMENT_BITS}-bit segments, "
                             f"not {header.segment_bits}")
        self.run_dir = run_dir
        self.header = header
        self.on_stop = on_stop
        self.slots = itertools.count()  # next() is the atomic slot reservation
        # Index = segment.  Replaced on each new segment, never changed in place, so a
        # thread's copy stays valid; live mappings: the newest two (see _RELEASED).
        self.maps: list[mmap.mmap] = []
        self._path: Path | None = None  # the newest segment, trimmed by close()
        self._lock = threading.Lock()  # guards segment opening and closing
        self.closed = False
        self.stopped = False  # a segment could not be created: nothing more is written
        self.open_segment(0)

    def append(self, packer: Callable[..., None], kind: int, *fields: Any) -> None:
        """Write one record: ``packer`` (a ``*_S.pack_into``) stores ``fields`` after the
        kind byte, then the kind byte commits it.  The only record-writing code there is.

        Raises ValueError (closed or released mapping), IndexError or OSError
        (``JournalStopped``); the recorder's callers catch all three."""
        idx = next(self.slots)
        seg = idx >> SEGMENT_BITS
        maps = self.maps
        mm = maps[seg] if seg < len(maps) else self.open_segment(seg)
        off = HEADER_SIZE + ((idx & SLOT_MASK) << RECORD_SHIFT)
        packer(mm, off + 1, *fields)
        mm[off] = kind

    def open_segment(self, seg: int) -> mmap.mmap:
        """The mapping of segment ``seg``, creating segments up to it; raises OSError
        (``JournalStopped``) once a segment could not be created, ValueError once closed."""
        with self._lock:
            try:
                while len(self.maps) <= seg and not (self.closed or self.stopped):
                    self._next_segment()
            except OSError as exc:
                # Keep only the text: a frame holding the exception is a reference cycle,
                # and the cycle would keep this writer's mappings until the next gc.
                failed = str(exc.strerror or exc)
            else:
                if self.closed or self.stopped:
                    raise ValueError("journal closed")
                return self.maps[seg]
        self._stop(failed)
        raise JournalStopped(failed)

    def _next_segment(self) -> None:
        """Create, allocate and map the next segment; release the one before the full one."""
        path = segment_path(self.run_dir, self.header, len(self.maps))
        size = self.header.segment_bytes
        try:
            mm = _create_segment(path, size)
        except OSError as exc:
            raise OSError(exc.errno, _no_space_message(path, size, exc)) from exc
        mm[:HEADER_S.size] = self.header.pack()
        maps = self.maps[:]
        if len(maps) >= 2:
            maps[-2] = _RELEASED  # unmapped as soon as no thread holds it any more
        maps.append(mm)
        self.maps, self._path = maps, path

    def _stop(self, message: str) -> None:
        """After a failed segment: warn once, tell the owner (which drops this writer, and
        with it the mappings, once the threads still writing into them are done)."""
        with self._lock:
            first, self.stopped = not self.stopped, True
        if first:
            warn_stopped(message)
            if self.on_stop is not None:
                self.on_stop(self)

    def close(self, trim: bool = True) -> None:
        """Unmap; with ``trim`` shrink the newest segment to the slots in use."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            # Reserving one more slot tells how many were used; nothing is written any more.
            used = next(self.slots) - ((len(self.maps) - 1) << SEGMENT_BITS)
            self._unmap()
            if trim and self._path is not None and not self.stopped:
                kept = min(max(0, used), SLOTS_PER_SEGMENT)
                with contextlib.suppress(OSError):  # e.g. its directory was removed
                    os.truncate(self._path, HEADER_SIZE + kept * RECORD_SIZE)

    def abandon(self) -> None:
        """Drop the mappings without touching the files (after fork: they are the parent's)."""
        self.closed = True
        self._unmap()

    def _unmap(self) -> None:
        for mm in self.maps[-2:]:
            mm.close()  # _RELEASED is closed already: close() again is a no-op
        self.maps = []


def _closed_map() -> mmap.mmap:
    mm = mmap.mmap(-1, mmap.PAGESIZE)
    mm.close()
    return mm


_RELEASED = _closed_map()  # stands for a released segment: any store raises ValueError


def _create_segment(path: Path, size: int) -> mmap.mmap:
    """A new file of ``size`` allocated bytes, mapped shared; nothing left behind on error.

    The file's own fd is closed at once: the mapping holds a duplicate of it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        _allocate(fd, size)
        return mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise
    finally:
        os.close(fd)


def _allocate(fd: int, size: int) -> None:
    """Give the file ``size`` bytes of real blocks, so stores into its mapping never fault."""
    if hasattr(os, "posix_fallocate"):
        os.posix_fallocate(fd, 0, size)
    else:  # pragma: no cover - not Linux: sparse, as before
        os.ftruncate(fd, size)


def _no_space_message(path: Path, size: int, exc: OSError) -> str:
    try:
        st = os.statvfs(path.parent)
        free = f"{st.f_bavail * st.f_frsize} bytes free"
    except OSError:
        free = "free space unknown"
    return (f"cannot allocate journal segment {path}: {size} bytes needed, {free} "
            f"({exc.strerror or exc})")


_warned_pid = 0


def warn_stopped(message: str) -> None:
    """The one warning per process that tracing stopped because a journal could not grow."""
    global _warned_pid
    if _warned_pid != os.getpid():
        _warned_pid = os.getpid()
        log.warning("tracing stopped: %s; the program carries on without recording spans",
                    message)


# ---------------------------------------------------------------- reading


@dataclasses.dataclass
class JournalFile:
    """All segments of one incarnation's journal, in order."""

    header: JournalHeader
    segments: list[Path]


def find_journals(run_dir: Path) -> list[JournalFile]:
    """Group the journal segment files of ``run_dir`` by incarnation."""
    groups: dict[str, dict[int, Path]] = {}
    for path in sorted(Path(run_dir).glob("journal-*.bin")):
        match = _SEGMENT_RE.match(path.name)
        if match:
            groups.setdefault(match.group(1), {})[int(match.group(2) or 0)] = path
    journals = []
    for segs in groups.values():
        if 0 not in segs:
            continue
        try:
            with open(segs[0], "rb") as f:
                header = JournalHeader.unpack(f.read(HEADER_S.size))
        except (ValueError, struct.error, OSError):
            continue  # a foreign or half-created file
        ordered = [segs[i] for i in range(len(segs)) if i in segs]
        journals.append(JournalFile(header, ordered))
    return journals

