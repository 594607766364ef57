"""The shared-memory ring on its own: streaming, deadlines, and damage that is detected."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from executor import CorruptMessageError, QueueCorruptedError, QueueFullError, failpoints
from executor.shm_queue import QueueReader, QueueSpec, QueueWriter, ShmRingBuffer

CHUNK = 256


@pytest.fixture
def ring() -> Iterator[tuple[QueueWriter, list[QueueReader]]]:
    ring = ShmRingBuffer(QueueSpec("test", 2, 4, CHUNK))
    ring.segment.close_fd()  # no other process attaches: the mapping is all we need
    yield QueueWriter(ring, [], None), [QueueReader(ring, r, None, None) for r in range(2)]
    failpoints.disable()


def _read(reader: QueueReader, timeout: float = 5.0) -> tuple[int, bytes]:
    got = reader.read(time.monotonic() + timeout)
    assert got is not None, "nothing to read"
    return got[0], bytes(got[1])


@pytest.mark.parametrize("size", [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK, 40 * CHUNK + 7])
def test_messages_of_any_size_reach_every_reader(ring, size: int) -> None:  # type: ignore[no-untyped-def]
    writer, readers = ring
    payload = bytes(i % 251 for i in range(size))
    results: list[tuple[int, bytes]] = []
    threads = [threading.Thread(target=lambda r=r: results.append(_read(r))) for r in readers]
    for t in threads:
        t.start()
    writer.write(7, [payload[: size // 2], payload[size // 2 :]], time.monotonic() + 5)
    for t in threads:
        t.join(10)
    assert results == [(7, payload), (7, payload)]


def test_reader_times_out_with_nothing_to_read(ring) -> None:  # type: ignore[no-untyped-def]
    _, readers = ring
    assert readers[0].read(time.monotonic() + 0.05) is None


def test_writer_deadline_names_the_reader_that_is_behind(ring) -> None:  # type: ignore[no-untyped-def]
    writer, readers = ring
    for i in range(4):
        writer.write(i, [b"x"], time.monotonic() + 1)
        _read(readers[0])
    with pytest.raises(QueueFullError, match=r"reader\(s\) \[1\]"):
        writer.write(4, [b"x"], time.monotonic() + 0.1)
    for i in range(4):
        assert _read(readers[1]) == (i, b"x")
    writer.write(5, [b"y"], time.monotonic() + 1)
    assert _read(readers[0]) == (5, b"y") and _read(readers[1]) == (5, b"y")


def test_message_cut_by_the_deadline_is_dropped_by_readers(ring) -> None:  # type: ignore[no-untyped-def]
    writer, readers = ring
    with pytest.raises(QueueFullError):  # 10 chunks into a 4-chunk ring that nobody reads
        writer.write(1, [bytes(10 * CHUNK)], time.monotonic() + 0.1)
    drained: list[tuple[int, bytes]] = []
    threads = [threading.Thread(target=lambda r=r: drained.append(_read(r))) for r in readers]
    for t in threads:
        t.start()
    writer.write(2, [b"next"], time.monotonic() + 5)
    for t in threads:
        t.join(10)
    assert drained == [(2, b"next"), (2, b"next")]


def _damage(offset: str, at: int, value: int):  # type: ignore[no-untyped-def]
    def action(ring: ShmRingBuffer, index: int, msg_id: int, **_: object) -> None:
        if msg_id == 2:
            base = ring.datas[index] if offset == "data" else ring.metas[index]
            ring.buf[base + at] ^= value

    return action


def test_flipped_payload_byte_is_reported_and_the_queue_stays_usable(ring) -> None:  # type: ignore[no-untyped-def]
    writer, readers = ring
    failpoints.enable("queue.before_publish", _damage("data", 3, 0xFF))
    for msg_id in (1, 2, 3):
        writer.write(msg_id, [b"payload-%d" % msg_id], time.monotonic() + 1)
    for reader in readers:
        assert _read(reader) == (1, b"payload-1")
        with pytest.raises(CorruptMessageError, match="failed its checksum") as info:
            reader.read(time.monotonic() + 1)
        assert info.value.msg_id == 2
        assert _read(reader) == (3, b"payload-3")


def test_flipped_byte_in_a_streamed_message_is_reported(ring) -> None:  # type: ignore[no-untyped-def]
    writer, readers = ring
    failpoints.enable("queue.before_publish", _damage("data", 10, 0x01))
    errors: list[BaseException] = []

    def read_two(reader: QueueReader) -> None:
        try:
            reader.read(time.monotonic() + 5)
        except CorruptMessageError as exc:
            errors.append(exc)
        assert _read(reader) == (3, b"after")

    threads = [threading.Thread(target=read_two, args=(r,)) for r in readers]
    for t in threads:
        t.start()
    writer.write(2, [bytes(3 * CHUNK)], time.monotonic() + 5)
    writer.write(3, [b"after"], time.monotonic() + 5)
    for t in threads:
        t.join(10)
    assert len(errors) == 2


@pytest.mark.parametrize(("what", "at", "phrase"), [
    ("sequence number", 8, "metadata failed its checksum|sequence number|overwritten"),
    ("flags", 36, "metadata failed its checksum"),
    ("length", 32, "metadata failed its checksum|exceeds"),
])
def test_clobbered_metadata_is_fatal_never_garbage(ring, what: str, at: int, phrase: str) -> None:  # type: ignore[no-untyped-def]
    writer, readers = ring
    failpoints.enable("queue.before_publish", _damage("meta", at, 0x40))
    writer.write(1, [b"fine"], time.monotonic() + 1)
    writer.write(2, [b"damaged"], time.monotonic() + 1)
    assert _read(readers[0]) == (1, b"fine")
    with pytest.raises(QueueCorruptedError, match=phrase):
        readers[0].read(time.monotonic() + 1)


def test_overwritten_unread_chunk_is_detected(ring) -> None:  # type: ignore[no-untyped-def]
    writer, readers = ring
    for i in range(4):
        writer.write(i, [b"a"], time.monotonic() + 1)
        _read(readers[0])
    # Damage: a reader's read flag set on a chunk it has not read lets the writer lap it.
    writer.ring.buf[writer.ring.metas[0] + 48 + 1] = 1
    writer.write(4, [b"b"], time.monotonic() + 1)
    with pytest.raises(QueueCorruptedError, match="overwritten before this reader read it"):
        readers[1].read(time.monotonic() + 1)


def test_a_clobbered_read_flag_does_not_make_a_reader_skip(ring) -> None:  # type: ignore[no-untyped-def]
    writer, readers = ring
    writer.write(1, [b"m"], time.monotonic() + 1)
    writer.ring.buf[writer.ring.metas[0] + 48 + 0] = 1  # as if reader 0 had read it
    assert _read(readers[0]) == (1, b"m")


def _after_publish(damage: str):  # type: ignore[no-untyped-def]
    def action(ring: ShmRingBuffer, index: int, seq: int, **_: object) -> None:
        if seq != 2:
            return
        base = ring.metas[index]
        if damage == "clear_written":
            ring.buf[base] = 0
        elif damage == "written_ff":
            ring.buf[base] = 0xFF
        else:  # every metadata byte, read flags included
            ring.buf[base : base + ring.spec.meta_size] = b"\xff" * ring.spec.meta_size

    return action


@pytest.mark.parametrize("damage", ["clear_written", "written_ff", "all_ff"])
def test_a_damaged_written_flag_is_reported_never_waited_on(ring, damage: str) -> None:  # type: ignore[no-untyped-def]
    writer, readers = ring
    failpoints.enable("queue.after_publish", _after_publish(damage))
    writer.write(1, [b"fine"], time.monotonic() + 1)
    writer.write(2, [b"damaged"], time.monotonic() + 1)
    assert _read(readers[0]) == (1, b"fine")
    with pytest.raises(QueueCorruptedError, match="chunk 1"):
        readers[0].read(None)  # no deadline: a hang here is the bug


def test_a_cleared_read_flag_of_a_reader_that_read_is_damage_not_a_full_queue(ring) -> None:  # type: ignore[no-untyped-def]
    writer, readers = ring
    for i in range(4):
        writer.write(i, [b"a"], time.monotonic() + 1)
        assert _read(readers[0]) == (i, b"a") and _read(readers[1]) == (i, b"a")
    writer.ring.buf[writer.ring.metas[0] + 48 + 1] = 0  # reader 1 read chunk 0; its flag says not
    with pytest.raises(QueueCorruptedError, match="reader 1 has read seq 1"):
        writer.write(4, [b"b"], time.monotonic() + 5)


def test_a_written_flag_cleared_after_every_reader_took_the_chunk_is_caught_by_the_writer(ring) -> None:  # type: ignore[no-untyped-def]
    """Chaos's clear_written when every reader took the chunk before the damage landed and
    looks again only after the next publish (smoke's clear-rpc-written-flag flake under
    load): the header's claim of one more message published would be overwritten unseen."""
    from chaos.points import damage_chunk

    writer, readers = ring
    for msg_id in (1, 2):
        writer.write(msg_id, [b"m"], time.monotonic() + 1)
        assert _read(readers[0]) == (msg_id, b"m") and _read(readers[1]) == (msg_id, b"m")
    damage_chunk(writer.ring, 1, "clear_written")  # seq 2's chunk; the header now claims seq 3
    with pytest.raises(QueueCorruptedError, match="writer: the header says seq 3 was published"):
        writer.write(3, [b"next"], time.monotonic() + 1)
