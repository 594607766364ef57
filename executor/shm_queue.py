"""A one-writer, many-reader broadcast queue: a ring of fixed-size chunks in shared memory.

    writer (driver or worker)                      readers 0..N-1 (workers or driver)
          │ write(msg_id, parts)                         ▲ read() -> (msg_id, bytes)
          ▼                                              │
    ┌────────────────────────────── one segment ───────────────────────────────┐
    │ header │ sleeping flags [writer, r0..rN-1] │ meta[0..C-1] │ data[0..C-1] │
    └──────────────────────────────────────────────────────────────────────────┘
    meta[i] = written · seq · msg_id · total · length · flags · data_crc · meta_crc · read[0..N-1]

A message is one or more chunks (FIRST ... LAST); a message larger than a chunk streams
through the ring while readers copy it out, so no payload size needs a bigger ring.

Invariants:
- Only the writer writes a chunk's meta and data, and only while every read flag of that
  chunk is set (all readers are done with its previous content).  It clears ``written``,
  fills data and meta, clears the read flags, then sets ``written``.
- Chunks carry a global sequence number: chunk ``seq`` lives at index ``(seq - 1) % C``.
  A reader takes a chunk when ``written`` is set and ``seq`` is the one it expects, not by
  its read flag, so a clobbered read flag cannot make it skip or stall on a chunk.  Any
  other sequence number than the expected one or the one a lap earlier means the ring was
  damaged (or lapped a reader); that is raised as ``QueueCorruptedError``.
- ``meta_crc`` covers seq, msg_id, total, length and flags: damaged metadata is fatal,
  since the reader no longer knows where messages start.  ``data_crc`` covers a chunk's
  payload: a damaged payload is reported as ``CorruptMessageError`` for that msg_id, the
  rest of its chunks are consumed, and the queue stays in sync.
- The writer never waits forever: its wait has a deadline and the error names the readers
  that are behind.  A message interrupted half-way (deadline, exception) is closed by an
  ABORT chunk before the next message, so readers drop the partial message.
"""

from __future__ import annotations

import dataclasses
import struct
import time
from collections.abc import Callable, Sequence

import xxhash

from executor import failpoints
from executor.errors import CorruptMessageError, QueueCorruptedError, QueueFullError
from executor.shm import SegmentFd, ShmSegment
from executor.waiting import DEFAULT_POLICY, Doorbell, Sleeper, WaitPolicy, fence, ring

MAGIC = b"FLQ1"
_HEADER = struct.Struct("<4sIIIQ")  # magic, version, n_readers, n_chunks, chunk_bytes
_META = struct.Struct("<QQQIII")  # seq, msg_id, total, length, flags, data_crc
_META_ALL = struct.Struct("<QQQIIII")  # the same, then meta_crc
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_META_FIELDS = 8  # offset of seq inside a chunk's meta
_META_CRC = 44  # offset of meta_crc; it covers bytes 8..44
_READ_FLAGS = 48

FIRST, LAST, ABORT, CHECKED = 1, 2, 4, 8


def _digest(data: memoryview | bytes | bytearray) -> int:
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
        return _align(_READ_FLAGS + self.n_readers, 8)

    @property
    def flags_offset(self) -> int:
        return 64

    @property
    def meta_offset(self) -> int:
        return self.flags_offset + _align(1 + self.n_readers, 64)

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
        _HEADER.pack_into(self.buf, 0, MAGIC, 1, spec.n_readers, spec.n_chunks, spec.chunk_bytes)
        for base in self.metas:
            self.buf[base : base + spec.meta_size] = bytes(spec.meta_size)
            self.buf[base + _READ_FLAGS : base + _READ_FLAGS + spec.n_readers] = (
                b"\1" * spec.n_readers
            )

    def _check_header(self) -> None:
        magic, _version, n_readers, n_chunks, chunk_bytes = _HEADER.unpack_from(self.buf, 0)
        spec = self.spec
        if (magic, n_readers, n_chunks, chunk_bytes) != (
            MAGIC, spec.n_readers, spec.n_chunks, spec.chunk_bytes,
        ):
            raise QueueCorruptedError(f"queue {spec.name}: header does not match its spec")

    def meta(self, index: int) -> int:
        return self.metas[index]

    def data(self, index: int) -> int:
        return self.datas[index]

    def seq_at(self, index: int) -> int:
        return int(_U64.unpack_from(self.buf, self.metas[index] + _META_FIELDS)[0])

    def close(self) -> None:
        self.flags.release()
        self.buf = None  # type: ignore[assignment]
        self.segment.close()


@dataclasses.dataclass
class _Partial:
    """A multi-chunk message a reader has begun copying out."""

    msg_id: int
    out: bytearray
    pos: int = 0
    damaged: str = ""


class QueueWriter:
    """The single writer of a queue.  Not thread-safe: one thread writes at a time."""

    def __init__(
        self,
        ring: ShmRingBuffer,
        reader_bells: Sequence[int],
        own_bell: Doorbell | None,
        interrupt_fds: Sequence[int] = (),
        on_interrupt: Callable[[], None] = lambda: None,
        policy: WaitPolicy = DEFAULT_POLICY,
    ) -> None:
        self.ring = ring
        self.spec = ring.spec
        self._reader_bells = list(reader_bells)
        self._all_read = b"\1" * self.spec.n_readers
        self._no_reads = bytes(self.spec.n_readers)
        self._chunk_bytes = self.spec.chunk_bytes
        self._n_chunks = self.spec.n_chunks
        self._checksum = self.spec.checksum
        self._seq = 1  # the next chunk's sequence number
        self._aborted: int | None = None  # msg_id of a message left half-written
        self._sleeper = Sleeper(ring.flags, 0, own_bell, interrupt_fds, on_interrupt, policy)

    def write(self, msg_id: int, parts: Sequence[memoryview | bytes], deadline: float | None) -> None:
        """Publish one message; raises QueueFullError (nothing half-published) at ``deadline``."""
        if self._aborted is not None:
            self._publish_abort(deadline)
        total = 0
        for part in parts:
            total += len(part)  # parts are bytes or 1-D byte memoryviews
        if total <= self._chunk_bytes and not failpoints.ACTIVE:
            index = self._acquire(deadline)
            buf, pos = self.ring.buf, self.ring.datas[index]
            for part in parts:
                buf[pos : pos + len(part)] = part
                pos += len(part)
            self._publish(index, msg_id, total, total, FIRST | LAST)
            return
        try:
            self._write_chunks(msg_id, parts, total, deadline)
        except BaseException:
            self._aborted = msg_id
            raise

    def _write_chunks(
        self, msg_id: int, parts: Sequence[memoryview | bytes], total: int, deadline: float | None
    ) -> None:
        chunk_bytes = self.spec.chunk_bytes
        flags, written, index, pos = FIRST, 0, self._acquire(deadline), 0
        base = self.ring.data(index)
        for part in parts:
            view = memoryview(part).cast("B")
            offset = 0
            while offset < len(view):
                if pos == chunk_bytes:
                    self._publish(index, msg_id, total, pos, flags)
                    flags, index, pos = 0, self._acquire(deadline), 0
                    base = self.ring.data(index)
                n = min(chunk_bytes - pos, len(view) - offset)
                self.ring.buf[base + pos : base + pos + n] = view[offset : offset + n]
                pos, offset, written = pos + n, offset + n, written + n
                if failpoints.ACTIVE and written < total:
                    failpoints.fire("queue.mid_chunk_write", queue=self.spec.name, msg_id=msg_id)
        self._publish(index, msg_id, total, pos, flags | LAST)

    def _publish_abort(self, deadline: float | None) -> None:
        index = self._acquire(deadline)
        self._publish(index, self._aborted or 0, 0, 0, ABORT | LAST)
        self._aborted = None

    def _acquire(self, deadline: float | None) -> int:
        """Wait until the chunk for the next sequence number is free; return its index."""
        index = (self._seq - 1) % self._n_chunks
        flags = self.ring.metas[index] + _READ_FLAGS
        buf, n, all_read = self.ring.buf, self.spec.n_readers, self._all_read
        if buf[flags : flags + n] == all_read:
            return index
        if not self._sleeper.wait(lambda: buf[flags : flags + n] == all_read, deadline):
            behind = [r for r in range(n) if not buf[flags + r]]
            raise QueueFullError(
                f"queue {self.spec.name}: reader(s) {behind} have not read chunk {index} "
                f"(seq {self._seq - self.spec.n_chunks}) by the deadline; "
                "a reader is busy, hung or dead"
            )
        return index

    def _publish(self, index: int, msg_id: int, total: int, length: int, flags: int) -> None:
        buf, base = self.ring.buf, self.ring.metas[index]
        buf[base] = 0
        fence()
        crc = 0
        if self._checksum:
            data = self.ring.datas[index]
            crc, flags = _digest(buf[data : data + length]), flags | CHECKED
        _META.pack_into(buf, base + _META_FIELDS, self._seq, msg_id, total, length, flags, crc)
        _U32.pack_into(buf, base + _META_CRC, _digest(buf[base + _META_FIELDS : base + _META_CRC]))
        buf[base + _READ_FLAGS : base + _READ_FLAGS + len(self._no_reads)] = self._no_reads
        if failpoints.ACTIVE:  # the chunk is complete but not yet visible: damage goes here
            failpoints.fire("queue.before_publish", queue=self.spec.name, ring=self.ring,
                            index=index, msg_id=msg_id, seq=self._seq, flags=flags)
        fence()
        buf[base] = 1
        self._seq += 1
        fence()
        self._wake_readers()

    def _wake_readers(self) -> None:
        sleeping = self.ring.flags
        for r, bell in enumerate(self._reader_bells):
            if sleeping[1 + r]:
                ring(bell)


class QueueReader:
    """Reader ``index`` of a queue.  Not thread-safe: one thread reads at a time."""

    def __init__(
        self,
        ring: ShmRingBuffer,
        index: int,
        own_bell: Doorbell | None,
        writer_bell: int | None,
        interrupt_fds: Sequence[int] = (),
        on_interrupt: Callable[[], None] = lambda: None,
        policy: WaitPolicy = DEFAULT_POLICY,
    ) -> None:
        self.ring = ring
        self.spec = ring.spec
        self.index = index
        self._writer_bell = writer_bell
        self._seq = 1  # the sequence number of the next chunk to take
        self._n_chunks = self.spec.n_chunks
        self._chunk_bytes = self.spec.chunk_bytes
        self._partial: _Partial | None = None
        self._sleeper = Sleeper(
            ring.flags, 1 + index, own_bell, interrupt_fds, on_interrupt, policy
        )

    def read(self, deadline: float | None) -> tuple[int, bytes | bytearray] | None:
        """Return the next whole message as ``(msg_id, data)``, or None at ``deadline``.

        Raises CorruptMessageError for a message whose payload failed its checksum (it has
        been consumed) and QueueCorruptedError when the metadata itself is damaged.
        """
        while True:
            meta = self._take(deadline)
            if meta is None:
                return None
            message = self._assemble(meta)
            if message is not None:
                return message

    def _assemble(self, meta: tuple[int, ...]) -> tuple[int, bytes | bytearray] | None:
        _seq, msg_id, total, length, flags, crc, index = meta
        if flags & ABORT:
            self._release(index)
            self._partial = None
            return None
        if flags & FIRST:
            if self._partial is not None:
                raise self._fatal(index, "a new message began inside another one")
            if flags & LAST:
                return self._single(index, msg_id, length, flags, crc)
            self._partial = _Partial(msg_id, bytearray(total))
        partial = self._partial
        if partial is None or partial.msg_id != msg_id or partial.pos + length > total:
            raise self._fatal(index, "a continuation chunk does not belong to the open message")
        data = self.ring.datas[index]
        # Through a memoryview: bytearray slicing copies (twice, for slice assignment).
        with memoryview(partial.out) as out:
            piece = out[partial.pos : partial.pos + length]
            piece[:] = self.ring.buf[data : data + length]
            self._release(index)
            if flags & CHECKED and crc != _digest(piece):
                partial.damaged = partial.damaged or f"chunk {index} failed its checksum"
            piece.release()
        partial.pos += length
        if not flags & LAST:
            return None
        self._partial = None
        if partial.damaged or partial.pos != total:
            raise self._damaged(msg_id, partial.damaged or "message shorter than announced")
        return msg_id, partial.out

    def _single(
        self, index: int, msg_id: int, length: int, flags: int, crc: int
    ) -> tuple[int, bytes]:
        data = self.ring.datas[index]
        out = bytes(self.ring.buf[data : data + length])
        self._release(index)
        if flags & CHECKED and crc != _digest(out):
            raise self._damaged(msg_id, f"chunk {index} failed its checksum")
        return msg_id, out

    def _take(self, deadline: float | None) -> tuple[int, ...] | None:
        """Wait for the chunk with the expected sequence number and return its meta."""
        index = (self._seq - 1) % self._n_chunks
        buf, base, expected = self.ring.buf, self.ring.metas[index], self._seq
        old = expected - self._n_chunks
        seq_of = _U64.unpack_from

        def ready() -> bool:
            # seq before written: the writer clears written before it touches seq and sets
            # it last, so a new seq seen with written set means the whole chunk is there.
            return seq_of(buf, base + _META_FIELDS)[0] != old and buf[base] == 1

        if not ready() and not self._sleeper.wait(ready, deadline):
            return None
        fence()
        seq, msg_id, total, length, flags, crc, meta_crc = _META_ALL.unpack_from(
            buf, base + _META_FIELDS
        )
        if seq != expected:
            self._recheck(index, expected)
            seq, msg_id, total, length, flags, crc, meta_crc = _META_ALL.unpack_from(
                buf, base + _META_FIELDS
            )
        if meta_crc != _digest(buf[base + _META_FIELDS : base + _META_CRC]):
            raise self._fatal(index, "chunk metadata failed its checksum")
        if length > self._chunk_bytes:
            raise self._fatal(index, f"chunk length {length} exceeds the chunk size")
        self._seq += 1
        return seq, msg_id, total, length, flags, crc, index

    def _recheck(self, index: int, expected: int) -> int:
        """A torn read while the writer rewrites the chunk heals itself; damage persists."""
        time.sleep(0.001)
        fence()
        seq = self.ring.seq_at(index)
        if seq == expected and self.ring.buf[self.ring.meta(index)] == 1:
            return seq
        if seq > expected:
            what = f"overwritten before this reader read it (seq {seq}, expected {expected})"
            raise self._fatal(index, what)
        raise self._fatal(index, f"sequence number {seq} where {expected} was expected")

    def _release(self, index: int) -> None:
        buf = self.ring.buf
        buf[self.ring.metas[index] + _READ_FLAGS + self.index] = 1
        fence()
        if self._writer_bell is not None and self.ring.flags[0]:
            ring(self._writer_bell)

    def _fatal(self, index: int, what: str) -> QueueCorruptedError:
        return QueueCorruptedError(
            f"queue {self.spec.name}, reader {self.index}, chunk {index}: {what}; "
            "the shared-memory ring is damaged and cannot be trusted"
        )

    def _damaged(self, msg_id: int, what: str) -> CorruptMessageError:
        error = CorruptMessageError(
            f"message {msg_id} on queue {self.spec.name} was damaged in shared memory ({what}); "
            "it was discarded",
            exc_type="CorruptMessageError",
            exc_message=what,
        )
        error.msg_id = msg_id
        return error
