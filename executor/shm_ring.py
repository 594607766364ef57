"""The ring's memory: its layout (``QueueSpec``), one process's mapping (``ShmRingBuffer``)
and named access to a chunk's metadata (``ChunkMeta``).  The protocol that moves messages
through it is ``executor/shm_queue.py``; the picture of the layout is there too.

    ┌──────────────────────────────────── one segment ────────────────────────────────────┐
    │ header · published │ sleeping [writer, r0..rN-1] │ progress[r0..rN-1] │ meta[] │ data[] │
    └──────────────────────────────────────────────────────────────────────────────────────┘
"""

from __future__ import annotations

import dataclasses
import struct

import xxhash

from executor.errors import QueueCorruptedError
from executor.shm import SegmentFd, ShmSegment

MAGIC = b"FLQ1"
VERSION = 2
_HEADER = struct.Struct("<4sIIIQ")  # magic, version, n_readers, n_chunks, chunk_bytes
PUBLISHED = 24  # u64 in the header: the last sequence number the writer published
META = struct.Struct("<QQQIII")  # seq, msg_id, total, length, flags, data_crc
META_ALL = struct.Struct("<QQQIIII")  # the same, then meta_crc
U32 = struct.Struct("<I")
U64 = struct.Struct("<Q")
META_FIELDS = 8  # offset of seq inside a chunk's meta
META_CRC = 44  # offset of meta_crc; it covers bytes 8..44
READ_FLAGS = 48

FIRST, LAST, ABORT, CHECKED = 1, 2, 4, 8


def digest(data: memoryview | bytes | bytearray) -> int:
    """A 32-bit check value: xxh3 runs at ~10 GB/s here, CRC32 at ~2."""
    return xxhash.xxh3_64_intdigest(data) & 0xFFFFFFFF


def _align(n: int, to: int) -> int:
    return (n + to - 1) // to * to


@dataclasses.dataclass(frozen=True)
class QueueSpec:
    """Everything a process needs to attach to a queue (doorbells travel separately)."""

    name: str
    n_readers: int
    n_chunks: int = 8
    chunk_bytes: int = 1 << 20
    checksum: bool = True

    def __post_init__(self) -> None:
        if self.n_readers < 1 or self.n_readers > 255:
            raise ValueError(f"n_readers must be in 1..255, got {self.n_readers}")
        if self.n_chunks < 2:
            raise ValueError(f"n_chunks must be at least 2, got {self.n_chunks}")
        if self.chunk_bytes < 64:
            raise ValueError(f"chunk_bytes must be at least 64, got {self.chunk_bytes}")

    @property
    def meta_size(self) -> int:
        return _align(READ_FLAGS + self.n_readers, 8)

    @property
    def flags_offset(self) -> int:
        return 64

    @property
    def progress_offset(self) -> int:
        return self.flags_offset + _align(1 + self.n_readers, 64)

    @property
    def meta_offset(self) -> int:
        return self.progress_offset + _align(8 * self.n_readers, 64)

    @property
    def data_offset(self) -> int:
        return _align(self.meta_offset + self.n_chunks * self.meta_size, 64)

    @property
    def size(self) -> int:
        return self.data_offset + self.n_chunks * self.chunk_bytes


class ShmRingBuffer:
    """The segment and its layout; one instance per process that maps it."""

    def __init__(self, spec: QueueSpec, attach: SegmentFd | None = None) -> None:
        """Create the segment (the driver), or ``attach`` to the one behind a handle (workers)."""
        self.spec = spec
        create = attach is None
        self.segment = (ShmSegment.create(spec.name, spec.size) if attach is None
                        else ShmSegment.attach(attach, spec.size, spec.name))
        self.buf = self.segment.buf
        # Offsets are computed once: the hot path only indexes these lists.
        self.metas = [spec.meta_offset + i * spec.meta_size for i in range(spec.n_chunks)]
        self.datas = [spec.data_offset + i * spec.chunk_bytes for i in range(spec.n_chunks)]
        if create:
            self._format()
        else:
            self._check_header()
        self.flags = self.buf[spec.flags_offset : spec.flags_offset + 1 + spec.n_readers]

    def _format(self) -> None:
        spec = self.spec
        _HEADER.pack_into(self.buf, 0, MAGIC, VERSION, spec.n_readers, spec.n_chunks, spec.chunk_bytes)
        for base in self.metas:
            self.buf[base : base + spec.meta_size] = bytes(spec.meta_size)
            self.buf[base + READ_FLAGS : base + READ_FLAGS + spec.n_readers] = (
                b"\1" * spec.n_readers
            )

    def _check_header(self) -> None:
        magic, version, n_readers, n_chunks, chunk_bytes = _HEADER.unpack_from(self.buf, 0)
        spec = self.spec
        if (magic, version, n_readers, n_chunks, chunk_bytes) != (
            MAGIC, VERSION, spec.n_readers, spec.n_chunks, spec.chunk_bytes,
        ):
            raise QueueCorruptedError(f"queue {spec.name}: header does not match its spec")

    def meta(self, index: int) -> int:
        return self.metas[index]

    def data(self, index: int) -> int:
        return self.datas[index]

    def seq_at(self, index: int) -> int:
        return int(U64.unpack_from(self.buf, self.metas[index] + META_FIELDS)[0])

    def published(self) -> int:
        return int(U64.unpack_from(self.buf, PUBLISHED)[0])

    def overstate_published(self, by: int = 1) -> None:
        """Damage, for chaos: the header claims ``by`` more messages published than were.
        A reader waiting for the next one then finds it published but not written."""
        U64.pack_into(self.buf, PUBLISHED, self.published() + by)

    def progress(self, reader: int) -> int:
        return int(U64.unpack_from(self.buf, self.spec.progress_offset + 8 * reader)[0])

    def close(self) -> None:
        self.flags.release()
        self.buf = None  # type: ignore[assignment]
        self.segment.close()


class ChunkMeta:
    """A chunk's metadata read and written by name, for tools that inspect or damage a ring
    on purpose (chaos): the byte layout stays this module's business.

    ``meta`` is the chunk's meta offset (``ring.metas[index]``)."""

    FIELDS = ("seq", "msg_id", "total", "length", "flags", "data_crc")
    FIRST, LAST, ABORT = FIRST, LAST, ABORT
    SIZE_WITH_FIRST_READ_FLAG = READ_FLAGS + 1  # written flag through reader 0's read flag

    def __init__(self, buf: memoryview, meta: int) -> None:
        self.buf, self.meta = buf, meta

    def read(self) -> dict[str, int]:
        return dict(zip(self.FIELDS, META.unpack_from(self.buf, self.meta + META_FIELDS), strict=True))

    def write(self, *, reseal: bool, **changes: int) -> None:
        """Change fields; ``reseal`` recomputes meta_crc so only other checks can tell."""
        fields = self.read()
        unknown = set(changes) - set(fields)
        if unknown:
            raise ValueError(f"unknown chunk metadata fields {sorted(unknown)}")
        fields.update(changes)
        META.pack_into(self.buf, self.meta + META_FIELDS, *(fields[f] for f in self.FIELDS))
        if reseal:
            self.reseal()

    def reseal(self) -> None:
        base = self.meta
        U32.pack_into(self.buf, base + META_CRC, digest(self.buf[base + META_FIELDS : base + META_CRC]))

    @property
    def written(self) -> int:
        return int(self.buf[self.meta])

    @written.setter
    def written(self, value: int) -> None:
        self.buf[self.meta] = value
