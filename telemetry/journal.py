"""The span journal: fixed-size binary records in a per-process, append-only mmap'd file.

Data flow::

    hot path (any thread)                  page cache              reader (any process)
    JournalWriter.reserve() -> slot  ──►  journal-*.bin (mmap)  ──►  find_journals + pread
    Struct.pack_into(mm, offset + 1)      outlives SIGKILL          -> assemble.SpanAssembler
    mm[offset] = kind  (commit mark)

File layout: a ``HEADER_SIZE`` header (magic, version, pid, rank, role, service, created
time, an incarnation id) followed by ``SLOTS_PER_SEGMENT`` slots of ``RECORD_SIZE`` bytes.
When a segment fills, the writer opens the next segment file of the same incarnation.
Files are created sparse (``ftruncate``), so unused slots read as zeros and cost no disk.

Invariants:

- A slot is reserved by ``next(itertools.count)``, which is atomic under the GIL, so
  threads never share a slot.  Records of one span are written by one thread in order,
  so their slot indices are increasing.
- A record's first byte (its kind) is stored *after* the rest of the record: a slot whose
  kind byte is 0 is either unwritten or torn by a kill in mid-write, and readers skip it.
  (The writer's stores land in the shared page cache in program order on one CPU.)
- A string is written (as one or more STRING records) before any record that names its id.
- Writes are plain memory stores: no syscall, no flush.  The kernel keeps the pages of a
  killed process, which is the whole crash-safety story.
"""

from __future__ import annotations

import dataclasses
import itertools
import mmap
import os
import re
import struct
import threading
from pathlib import Path

MAGIC = b"FLJRNL01"
VERSION = 1
HEADER_SIZE = 256
RECORD_SIZE = 64
SEGMENT_BITS = 16
SLOTS_PER_SEGMENT = 1 << SEGMENT_BITS  # 4 MiB of records per segment file
SLOT_MASK = SLOTS_PER_SEGMENT - 1
NO_RANK = -1

# Record kinds (first byte of a slot).
SPAN_START = 1
SPAN_END = 2
ATTRIBUTE = 3
EVENT = 4
STRING = 5
THREAD = 6
KINDS = (SPAN_START, SPAN_END, ATTRIBUTE, EVENT, STRING, THREAD)

# SPAN_START flags.
FLAG_SAMPLED = 0x01
FLAG_POINT = 0x02  # a zero-length span written by Recorder.event()

# SPAN_END status codes (OpenTelemetry StatusCode values).
STATUS_UNSET, STATUS_OK, STATUS_ERROR = 0, 1, 2

# ATTRIBUTE value types and owners.
VT_STR, VT_INT, VT_FLOAT, VT_BOOL, VT_JSON = 1, 2, 3, 4, 5
OWNER_SPAN, OWNER_EVENT = 0, 1

# Structs pack a record *after* its kind byte (offset + 1): flags, small, id, then payload.
# The writer stores the kind byte last, as the commit mark.
_HEAD = "<BHI"
SPAN_START_S = struct.Struct(_HEAD + "QQQQQQ")  # trace_hi, trace_lo, span, parent, start, tid
SPAN_END_S = struct.Struct(_HEAD + "QQ")  # span_id, end_ns
ATTR_INT_S = struct.Struct(_HEAD + "Qq")  # owner, value (ints, bools, string ids)
ATTR_FLOAT_S = struct.Struct(_HEAD + "Qd")  # owner, value
EVENT_S = struct.Struct(_HEAD + "QQQ")  # span_id, time_ns, event seq (owner of its attrs)
STRING_S = struct.Struct(_HEAD + "I52s")  # total length, chunk bytes (small = chunk no.)
STRING_CHUNK = 52
THREAD_S = struct.Struct(_HEAD + "Q")  # id = thread name string id; native thread id
MAX_STRING = 8192  # longer strings are cut, so one string never floods the journal

# magic, version, pid, rank, created, incarnation, role, service, export owner's pid
HEADER_S = struct.Struct("<8sIiiQQ32s64si")


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

    def pack(self) -> bytes:
        rank = NO_RANK if self.rank is None else self.rank
        return HEADER_S.pack(
            MAGIC, VERSION, self.pid, rank, self.created_ns, self.incarnation,
            self.role.encode()[:32], self.service.encode()[:64], self.owner_pid,
        )

    @classmethod
    def unpack(cls, raw: bytes) -> JournalHeader:
        magic, version, pid, rank, created, inc, role, service, owner = HEADER_S.unpack_from(raw)
        if magic != MAGIC or version != VERSION:
            raise ValueError(f"not a faultlab journal (magic {magic!r}, version {version})")
        return cls(
            pid=pid, rank=None if rank == NO_RANK else rank,
            role=role.rstrip(b"\0").decode(), service=service.rstrip(b"\0").decode(),
            created_ns=created, incarnation=inc, owner_pid=owner,
        )


def segment_path(run_dir: Path, header: JournalHeader, segment: int) -> Path:
    rank = "x" if header.rank is None else str(header.rank)
    suffix = "" if segment == 0 else f".s{segment}"
    stem = f"journal-{header.role}-{rank}-{header.pid}-{header.incarnation:016x}"
    return run_dir / f"{stem}{suffix}.bin"


_SEGMENT_RE = re.compile(r"^(journal-.+-[0-9a-f]{16})(?:\.s(\d+))?\.bin$")


class JournalWriter:
    """Appends records for one process incarnation; cheap enough for the hot path."""

    def __init__(self, run_dir: Path, header: JournalHeader) -> None:
        self.run_dir = run_dir
        self.header = header
        self.slots = itertools.count()  # next() is the atomic slot reservation
        self.maps: list[mmap.mmap] = []  # index = segment; only open_segment appends
        self._files: list[int] = []
        self._lock = threading.Lock()  # guards segment opening only
        self.closed = False
        self.open_segment(0)

    def reserve(self) -> tuple[mmap.mmap, int]:
        """Reserve one slot; return the mapping and byte offset to write it at.

        ``Recorder`` inlines this on its hottest paths; keep the two in step.
        """
        idx = next(self.slots)
        seg = idx >> SEGMENT_BITS
        maps = self.maps
        mm = maps[seg] if seg < len(maps) else self.open_segment(seg)
        return mm, HEADER_SIZE + (idx & SLOT_MASK) * RECORD_SIZE

    def open_segment(self, seg: int) -> mmap.mmap:
        with self._lock:
            while len(self.maps) <= seg:
                path = segment_path(self.run_dir, self.header, len(self.maps))
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
                size = HEADER_SIZE + SLOTS_PER_SEGMENT * RECORD_SIZE
                os.ftruncate(fd, size)
                mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
                mm[:HEADER_S.size] = self.header.pack()
                self._files.append(fd)
                self.maps.append(mm)
            return self.maps[seg]

    def used_slots(self) -> int:
        """Slots reserved so far (a snapshot; other threads may reserve more)."""
        return _peek_count(self.slots)

    def close(self, trim: bool = True) -> None:
        """Unmap and close; with ``trim`` shrink the last segment to the slots in use."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            used = self.used_slots()
            for seg, (mm, fd) in enumerate(zip(self.maps, self._files, strict=True)):
                mm.close()
                if trim and seg == len(self.maps) - 1:
                    last = used - seg * SLOTS_PER_SEGMENT
                    os.ftruncate(fd, HEADER_SIZE + max(0, last) * RECORD_SIZE)
                os.close(fd)
            self.maps, self._files = [], []

    def abandon(self) -> None:
        """Drop the mappings without touching the files (after fork: they are the parent's)."""
        self.closed = True
        for mm in self.maps:
            mm.close()
        for fd in self._files:
            os.close(fd)
        self.maps, self._files = [], []


def _peek_count(counter: itertools.count[int]) -> int:
    # repr is "count(N)"; reading it does not advance the counter.
    return int(repr(counter)[6:-1])


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

