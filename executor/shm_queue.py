"""A one-writer, many-reader broadcast queue: a ring of fixed-size chunks in shared memory.

    writer (driver or worker)                      readers 0..N-1 (workers or driver)
          │ write(msg_id, parts)                         ▲ read() -> (msg_id, bytes)
          ▼                                              │
    ┌──────────────────────────────────── one segment ────────────────────────────────────┐
    │ header · published │ sleeping [writer, r0..rN-1] │ progress[r0..rN-1] │ meta[] │ data[] │
    └──────────────────────────────────────────────────────────────────────────────────────┘
    meta[i] = written · seq · msg_id · total · length · flags · data_crc · meta_crc · read[0..N-1]
    published = the last sequence number the writer made visible; progress[r] = the next
    sequence number reader r will take (both written by their one owner, read by the others)

A message is one or more chunks (FIRST ... LAST); a message larger than a chunk streams
through the ring while readers copy it out, so no payload size needs a bigger ring.  A
reader copies each byte once: at a message's first chunk (of a multi-chunk message, or a
one-chunk one of 64 KiB or more) its ``layout`` (``serialization.frame_layout``) names the
objects the message goes into, the large buffers straight into the values the caller gets;
other messages land in one bytes/bytearray.

Invariants:
- Only the writer writes a chunk's meta and data, and only while every read flag of that
  chunk is set (all readers are done with its previous content).  It clears ``written``,
  fills data and meta, clears the read flags, then sets ``written``.
- Chunks carry a global sequence number: chunk ``seq`` lives at index ``(seq - 1) % C``.
  A reader takes a chunk when ``written`` is set and ``seq`` is the one it expects, not by
  its read flag, so a clobbered read flag cannot make it skip or stall on a chunk.  Any
  other sequence number than the expected one or the one a lap earlier means the ring was
  damaged (or lapped a reader); that is raised as ``QueueCorruptedError``.
- Every byte of chunk metadata is checked.  ``meta_crc`` covers seq, msg_id, total, length
  and flags.  The ``written`` flag is cross-checked against ``published``: a chunk whose
  sequence number was published but does not read as written and in sequence is damaged
  (a reader never waits forever on it).  ``published`` has one writer, which checks it
  before each message: a header that claims more (or less) than it published is damage,
  also when every reader took the chunk before the damage landed and would never look
  (the next publish would overwrite the claim unseen).  A read flag is cross-checked against the reader's
  ``progress``: a flag that says "unread" for a chunk its reader has passed is damaged (the
  writer never blames a healthy reader).  Damaged metadata is fatal,
  since the reader no longer knows where messages start.  ``data_crc`` covers a chunk's
  payload: a damaged payload is reported as ``CorruptMessageError`` for that msg_id, the
  rest of its chunks are consumed, and the queue stays in sync.
- The writer never waits forever: its wait has a deadline and the error names the readers
  that are behind.  A message interrupted half-way (deadline, exception) is closed by an
  ABORT chunk before the next message, so readers drop the partial message.  While it
  waits, the writer calls ``relieve`` (the driver drains replies there: a worker blocked on
  its reply queue can then free request chunks, so any number of calls can be in flight).
- Interruptible at any instant (KeyboardInterrupt in the driver): each end's state changes
  in one statement that makes no call, so an exception between two steps leaves a state
  the next call resumes from.  A reader keeps the message it returned (``held``) until the
  caller ``ack()``s it, and releases chunks idempotently; a writer interrupted inside a
  publish finishes or redoes it before its next message.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from executor import failpoints
from executor.errors import CorruptMessageError, QueueCorruptedError, QueueFullError
from executor.serialization import frame_layout
from executor.shm_assembly import Layout, Partial, digest_pieces, partial_for, scatter
from executor.shm_ring import (  # the queue's public names (QueueSpec, ...) are re-exported
    ABORT,
    CHECKED,
    FIRST,
    LAST,
    ChunkMeta,
    QueueSpec,
    ShmRingBuffer,
)
from executor.shm_ring import META as _META
from executor.shm_ring import META_ALL as _META_ALL
from executor.shm_ring import META_CRC as _META_CRC
from executor.shm_ring import META_FIELDS as _META_FIELDS
from executor.shm_ring import PUBLISHED as _PUBLISHED
from executor.shm_ring import READ_FLAGS as _READ_FLAGS
from executor.shm_ring import U32 as _U32
from executor.shm_ring import U64 as _U64
from executor.shm_ring import digest as _digest
from executor.waiting import DEFAULT_POLICY, Doorbell, Sleeper, WaitPolicy, Warmth, fence, ring

_SPLIT_MIN = 256 << 10  # a one-chunk message this long goes through the reader's layout (as _SMALL)
_CHECK_S = 0.1  # a waiting writer looks for damaged read flags this often
_RELIEVE_S = (0.001, 0.05)  # a relieving writer's first and longest wait between reliefs

__all__ = ["ChunkMeta", "QueueReader", "QueueSpec", "QueueWriter", "ShmRingBuffer"]


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
        relieve: Callable[[], bool] | None = None,
        woke: Warmth | None = None,
    ) -> None:
        self.ring = ring
        self._woke = woke  # set per message: did it ring a sleeping reader's doorbell?
        self.spec = ring.spec
        self._reader_bells = list(reader_bells)
        self._all_read = b"\1" * self.spec.n_readers
        self._no_reads = bytes(self.spec.n_readers)
        self._chunk_bytes = self.spec.chunk_bytes
        self._n_chunks = self.spec.n_chunks
        self._checksum = self.spec.checksum
        self._seq = 1  # the next chunk's sequence number
        self._aborted: int | None = None  # msg_id of a message left half-written
        self._publishing: tuple[int, int, int, int, int] | None = None  # a publish cut short
        self._relieve = relieve  # called while waiting for a chunk; True if it made progress
        self._sleeper = Sleeper(ring.flags, 0, own_bell, interrupt_fds, on_interrupt, policy)

    def write(self, msg_id: int, parts: Sequence[memoryview | bytes], deadline: float | None) -> None:
        """Publish one message; raises QueueFullError (nothing half-published) at ``deadline``."""
        if self._woke is not None:
            self._woke.asleep = False
        if self._publishing is not None:
            self._finish_publish()
        if _U64.unpack_from(self.ring.buf, _PUBLISHED)[0] != self._seq - 1:
            raise self._header_damaged()
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
        published = 0  # chunks of this message already visible to the readers
        base = self.ring.data(index)
        for part in parts:
            view = memoryview(part).cast("B")
            offset = 0
            while offset < len(view):
                if pos == chunk_bytes:
                    self._publish(index, msg_id, total, pos, flags)
                    flags, index, pos, published = 0, self._acquire(deadline), 0, published + 1
                    base = self.ring.data(index)
                n = min(chunk_bytes - pos, len(view) - offset)
                self.ring.buf[base + pos : base + pos + n] = view[offset : offset + n]
                pos, offset, written = pos + n, offset + n, written + n
                if failpoints.ACTIVE and written < total:
                    failpoints.fire("queue.mid_chunk_write", queue=self.spec.name, msg_id=msg_id,
                                    published=published)
        self._publish(index, msg_id, total, pos, flags | LAST)

    def _publish_abort(self, deadline: float | None) -> None:
        index = self._acquire(deadline)
        self._publish(index, self._aborted or 0, 0, 0, ABORT | LAST)
        self._aborted = None

    def _acquire(self, deadline: float | None) -> int:
        """Wait until the chunk for the next sequence number is free; return its index."""
        index = (self._seq - 1) % self._n_chunks
        flags = self.ring.metas[index] + _READ_FLAGS
        if self.ring.buf[flags : flags + self.spec.n_readers] == self._all_read:
            return index
        return self._wait_free(index, flags, deadline)

    def _wait_free(self, index: int, flags: int, deadline: float | None) -> int:
        """Wait in slices: between them relieve the readers and look for damaged read flags."""
        buf, n, all_read = self.ring.buf, self.spec.n_readers, self._all_read

        def free() -> bool:
            return buf[flags : flags + n] == all_read

        pause = _RELIEVE_S[0] if self._relieve is not None else _CHECK_S
        while True:
            if self._relieve is not None:
                pause = _RELIEVE_S[0] if self._relieve() else min(2 * pause, _RELIEVE_S[1])
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                if free():
                    return index
                raise self._full(index, flags)
            until = now + pause if deadline is None else min(deadline, now + pause)
            if self._sleeper.wait(free, until):
                return index
            self._check_read_flags(index, flags)

    def _check_read_flags(self, index: int, flags: int) -> None:
        """A reader whose progress passed this chunk but whose flag says unread: damage."""
        old = self._seq - self._n_chunks  # the sequence number the chunk still holds
        for r in range(self.spec.n_readers):
            # Progress first: a reader sets its flag, then its progress, so once its
            # progress has passed the chunk its flag must read as set.
            passed = self.ring.progress(r) > old
            fence()
            flag = self.ring.buf[flags + r]
            if passed and flag != 1:
                raise QueueCorruptedError(
                    f"queue {self.spec.name}, chunk {index}: reader {r} has read seq {old} but "
                    f"its read flag reads {flag}; "
                    "the shared-memory ring is damaged and cannot be trusted"
                )

    def _full(self, index: int, flags: int) -> QueueFullError:
        behind = [r for r in range(self.spec.n_readers) if self.ring.buf[flags + r] != 1]
        return QueueFullError(
            f"queue {self.spec.name}: reader(s) {behind} have not read chunk {index} "
            f"(seq {self._seq - self.spec.n_chunks}) by the deadline; "
            "a reader is busy, hung or dead"
        )

    def _publish(self, index: int, msg_id: int, total: int, length: int, flags: int) -> None:
        self._publishing = (index, msg_id, total, length, flags)
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
        self._published(index, msg_id)

    def _published(self, index: int, msg_id: int) -> None:
        seq = self._seq
        _U64.pack_into(self.ring.buf, _PUBLISHED, seq)
        self._seq, self._publishing = seq + 1, None  # one statement: no interrupt in between
        fence()
        if failpoints.ACTIVE:
            failpoints.fire("queue.after_publish", queue=self.spec.name, ring=self.ring,
                            index=index, msg_id=msg_id, seq=seq)
        self._wake_readers()

    def _finish_publish(self) -> None:
        """A publish was interrupted: complete its bookkeeping if it became visible, else redo
        it (readers take no chunk before its written flag is set and its seq is theirs)."""
        assert self._publishing is not None
        index, msg_id = self._publishing[0], self._publishing[1]
        if self.ring.buf[self.ring.metas[index]] == 1 and self.ring.seq_at(index) == self._seq:
            self._published(index, msg_id)
        else:
            self._publish(*self._publishing)

    def _header_damaged(self) -> QueueCorruptedError:
        published = _U64.unpack_from(self.ring.buf, _PUBLISHED)[0]
        return QueueCorruptedError(
            f"queue {self.spec.name}, writer: the header says seq {published} was published, "
            f"but this writer published up to seq {self._seq - 1}; the shared-memory ring is "
            "damaged and cannot be trusted"
        )

    def _wake_readers(self) -> None:
        sleeping = self.ring.flags
        for r, bell in enumerate(self._reader_bells):
            if sleeping[1 + r]:
                ring(bell)
                if self._woke is not None:
                    self._woke.asleep = True


class QueueReader:
    """Reader ``index`` of a queue.  Not thread-safe: one thread reads at a time.

    ``read(hold=True)`` keeps the message it returns as ``held``: until ``ack()`` every
    ``read`` returns (or raises) the same one again, so a caller interrupted between
    receiving a message and recording it loses nothing.
    """

    def __init__(
        self,
        ring: ShmRingBuffer,
        index: int,
        own_bell: Doorbell | None,
        writer_bell: int | None,
        interrupt_fds: Sequence[int] = (),
        on_interrupt: Callable[[], None] = lambda: None,
        policy: WaitPolicy = DEFAULT_POLICY,
        layout: Layout | None = frame_layout,
        peers: Warmth | None = None,
    ) -> None:
        self.ring = ring
        self.spec = ring.spec
        self.index = index
        self._layout = layout  # where a message's bytes go (the executor's frames by default)
        self._writer_bell = writer_bell
        self._seq = 1  # the sequence number of the next chunk to take
        self._n_chunks = self.spec.n_chunks
        self._chunk_bytes = self.spec.chunk_bytes
        self._progress = self.spec.progress_offset + 8 * index
        # Per chunk: where its seq and this reader's read flag live (the hot path indexes these).
        self._seq_offsets = [base + _META_FIELDS for base in ring.metas]
        self._flag_offsets = [base + _READ_FLAGS + index for base in ring.metas]
        self._partial: Partial | None = None
        self._held: tuple[int, bytes | bytearray] | CorruptMessageError | None = None
        self._unreleased: tuple[int, int] | None = None  # (index, seq) taken, flag maybe not set
        self._sleeper = Sleeper(
            ring.flags, 1 + index, own_bell, interrupt_fds, on_interrupt, policy, peers
        )

    def read(
        self, deadline: float | None, hold: bool = False
    ) -> tuple[int, bytes | bytearray] | None:
        """Return the next whole message as ``(msg_id, data)``, or None at ``deadline``.

        Raises CorruptMessageError for a message whose payload failed its checksum (it has
        been consumed) and QueueCorruptedError when the metadata itself is damaged.  With
        ``hold``, the message (or its error) is kept and returned again until ``ack()``.
        """
        if self._held is None:
            self._next(deadline)
        held = self._held
        if not hold:
            self._held = None
        if isinstance(held, CorruptMessageError):
            raise held
        return held

    def _next(self, deadline: float | None) -> None:
        """Take chunks until a whole message (or its error) is held, or ``deadline``."""
        while self._held is None:
            if self._unreleased is not None:
                self._release()
            meta = self._take(deadline)
            if meta is None:
                return
            self._assemble(meta)
            self._release()

    def ack(self) -> None:
        """The caller has recorded the message ``read`` returned (or raised): drop it."""
        self._held = None

    def _assemble(self, meta: tuple[int, ...]) -> None:
        """Take one chunk into the reader's state: one committing statement at the end."""
        seq, msg_id, total, length, flags, crc, index = meta
        taken = (index, seq)
        if flags & ABORT:
            self._seq, self._partial, self._unreleased = seq + 1, None, taken
            return
        if flags & FIRST:
            if self._partial is not None:
                raise self._fatal(index, "a new message began inside another one")
            if flags & LAST and length < _SPLIT_MIN:
                self._single(taken, msg_id, length, flags, crc)
                return
            data = self.ring.datas[index]
            partial = partial_for(msg_id, total, self.ring.buf[data : data + length], self._layout)
        else:
            partial = self._partial  # type: ignore[assignment]
        if partial is None or partial.msg_id != msg_id or partial.pos + length > total:
            raise self._fatal(index, "a continuation chunk does not belong to the open message")
        damaged = self._copy(partial, index, length, flags, crc)
        new = partial._replace(pos=partial.pos + length, damaged=damaged)
        if not flags & LAST:
            self._seq, self._partial, self._unreleased = seq + 1, new, taken
            return
        held: tuple[int, bytes | bytearray] | CorruptMessageError = (msg_id, new.out)
        if new.damaged or new.pos != total:
            held = self._damaged(msg_id, new.damaged or "message shorter than announced")
        self._seq, self._partial, self._held, self._unreleased = seq + 1, None, held, taken

    def _copy(self, partial: Partial, index: int, length: int, flags: int, crc: int) -> str:
        """Copy a chunk into the open message (idempotent); its damage, if any."""
        data = self.ring.datas[index]
        # Through memoryviews: bytearray slicing copies (twice, for slice assignment).
        pieces = scatter(partial, self.ring.buf[data : data + length])
        bad = bool(flags & CHECKED) and crc != digest_pieces(pieces)  # what the caller gets
        for piece in pieces:
            piece.release()
        if partial.damaged or not bad:
            return partial.damaged
        return f"chunk {index} failed its checksum"

    def _single(self, taken: tuple[int, int], msg_id: int, length: int, flags: int, crc: int) -> None:
        index, seq = taken
        data = self.ring.datas[index]
        out = bytes(self.ring.buf[data : data + length])
        held: tuple[int, bytes] | CorruptMessageError = (msg_id, out)
        if flags & CHECKED and crc != _digest(out):
            held = self._damaged(msg_id, f"chunk {index} failed its checksum")
        self._seq, self._held, self._unreleased = seq + 1, held, taken

    def _take(self, deadline: float | None) -> tuple[int, ...] | None:
        """Wait for the chunk with the expected sequence number and return its meta."""
        index = (self._seq - 1) % self._n_chunks
        buf, base, expected = self.ring.buf, self.ring.metas[index], self._seq
        old, at_seq = expected - self._n_chunks, self._seq_offsets[index]
        seq_of = _U64.unpack_from

        def ready() -> bool:
            # seq before written: the writer clears written before it touches seq and sets
            # it last, so a new seq seen with written set means the whole chunk is there.
            # A published seq at or past ours with no such chunk is damage: take it to look.
            return (seq_of(buf, at_seq)[0] != old and buf[base] == 1) or (
                seq_of(buf, _PUBLISHED)[0] >= expected
            )

        if not ready() and not self._sleeper.wait(ready, deadline):
            return None
        fence()
        seq, msg_id, total, length, flags, crc, meta_crc = _META_ALL.unpack_from(
            buf, base + _META_FIELDS
        )
        if seq != expected or buf[base] != 1:
            self._recheck(index, expected)
            seq, msg_id, total, length, flags, crc, meta_crc = _META_ALL.unpack_from(
                buf, base + _META_FIELDS
            )
        if meta_crc != _digest(buf[base + _META_FIELDS : base + _META_CRC]):
            raise self._fatal(index, "chunk metadata failed its checksum")
        if length > self._chunk_bytes:
            raise self._fatal(index, f"chunk length {length} exceeds the chunk size")
        return seq, msg_id, total, length, flags, crc, index

    def _recheck(self, index: int, expected: int) -> None:
        """A torn read while the writer rewrites the chunk heals itself; damage persists."""
        time.sleep(0.001)
        fence()
        seq = self.ring.seq_at(index)
        written = self.ring.buf[self.ring.meta(index)]
        if seq == expected and written == 1:
            return
        if seq > expected and written == 1:
            what = f"overwritten before this reader read it (seq {seq}, expected {expected})"
            raise self._fatal(index, what)
        if seq == expected or self.ring.published() >= expected:
            what = (f"seq {expected} was published but the chunk reads seq {seq} with its "
                    f"written flag {written}")
            raise self._fatal(index, what)
        raise self._fatal(index, f"sequence number {seq} where {expected} was expected")

    def _release(self) -> None:
        """Set the read flag of the chunk last taken, unless that already happened (and the
        writer reused the chunk: then its seq changed before its flags were cleared)."""
        taken = self._unreleased
        if taken is None:
            return
        index, seq = taken
        buf = self.ring.buf
        flag = self._flag_offsets[index]
        if buf[flag] != 1 and _U64.unpack_from(buf, self._seq_offsets[index])[0] == seq:
            buf[flag] = 1
        _U64.pack_into(buf, self._progress, seq + 1)
        self._unreleased = None
        fence()
        if self._writer_bell is not None and self.ring.flags[0]:
            ring(self._writer_bell)

    def _fatal(self, index: int, what: str) -> QueueCorruptedError:
        return QueueCorruptedError(
            f"queue {self.spec.name}, reader {self.index}, chunk {index}: {what}; "
            "the shared-memory ring is damaged and cannot be trusted"
        )

    def _damaged(self, msg_id: int, what: str) -> CorruptMessageError:
        return CorruptMessageError(
            f"message {msg_id} on queue {self.spec.name} was damaged in shared memory ({what}); "
            "it was discarded",
            msg_id=msg_id, exc_message=what,
        )
