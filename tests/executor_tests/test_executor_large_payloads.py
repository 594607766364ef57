"""Large payloads (issue 14): each byte copied once from the ring into the caller's object.

A reader asks ``serialization.frame_layout`` where a message goes and writes its large
buffers straight into the final ``bytes``/``bytearray`` (arrays and tensors are views of
it).  Checked here: sizes around the chunk and in-band boundaries, every value type,
nesting, the one-copy property (buffer identity and tracemalloc's peak, never timing),
damage still caught across split pieces, and an interrupted assembly resumes cleanly.
"""

from __future__ import annotations

import os
import time
import tracemalloc
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

from executor import CorruptMessageError, ExecutorConfig, MultiprocExecutor
from executor.serialization import Frame, decode, encode, frame_layout
from executor.shm_queue import QueueReader, QueueSpec, QueueWriter, ShmRingBuffer

KiB, MiB = 1 << 10, 1 << 20
CHUNK = 128 * KiB
SIZES = [64 * KiB - 1, 64 * KiB, CHUNK - 100, CHUNK - 33, CHUNK, CHUNK + 1, 3 * CHUNK + 7, 2 * MiB]


def _ring(n_chunks: int = 4, chunk: int = CHUNK) -> tuple[ShmRingBuffer, QueueWriter, QueueReader]:
    ring = ShmRingBuffer(QueueSpec("large", 1, n_chunks, chunk))
    ring.segment.close_fd()  # no other process attaches
    return ring, QueueWriter(ring, [], None), QueueReader(ring, 0, None, None)


@pytest.fixture
def ring() -> Iterator[tuple[ShmRingBuffer, QueueWriter, QueueReader]]:
    made = _ring(n_chunks=40)  # 5 MiB: every message here fits without a concurrent reader
    yield made
    made[0].close()


def _through(ring: Any, obj: Any) -> tuple[Any, bytes | bytearray]:
    _, writer, reader = ring
    writer.write(1, encode(0, -1, obj), time.monotonic() + 5)
    got = reader.read(time.monotonic() + 5)
    assert got is not None
    return decode(got[1]), got[1]


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return type(b) is torch.Tensor and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return type(b) is np.ndarray and a.dtype == b.dtype and bool((a == b).all())
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def _values(size: int) -> list[Any]:
    raw = os.urandom(size)
    return [raw, bytearray(raw), np.frombuffer(raw[: size // 8 * 8], dtype=np.int64).copy(),
            torch.arange(size // 4, dtype=torch.int32),
            {"k": [raw, (bytearray(raw[:100]), torch.ones(size // 4))], "n": 3}]


@pytest.mark.parametrize("size", SIZES)
def test_every_type_round_trips_at_sizes_around_chunk_boundaries(ring, size: int) -> None:  # type: ignore[no-untyped-def]
    for value in _values(size):
        got, _ = _through(ring, value)
        assert _same(value, got), (size, type(value))


def test_large_bytes_is_the_object_the_reader_wrote(ring) -> None:  # type: ignore[no-untyped-def]
    payload = os.urandom(3 * CHUNK)
    got, frame = _through(ring, (payload, bytearray(payload)))
    assert type(frame) is Frame and got[0] == payload and got[1] == payload
    assert got[0] is frame.buffers[0] and got[1] is frame.buffers[1]  # no copy after the reader
    assert hash(got[0]) == hash(payload)  # a real, immutable bytes value


def test_arrays_and_tensors_are_views_of_the_received_buffer(ring) -> None:  # type: ignore[no-untyped-def]
    t = torch.arange(CHUNK, dtype=torch.int32)
    a = np.arange(CHUNK, dtype=np.float64)
    (gt, ga), frame = _through(ring, (t, a))
    assert type(frame) is Frame
    addresses = [np.frombuffer(b, dtype=np.uint8).ctypes.data for b in frame.buffers]
    assert sorted([gt.data_ptr(), ga.ctypes.data]) == sorted(addresses)
    gt[0] = 7  # writable, as a fresh tensor is
    assert int(gt[0]) == 7


@pytest.mark.parametrize("size", [MiB, 4 * MiB])
def test_receiving_allocates_the_payload_once(size: int) -> None:
    ring, writer, reader = _ring(n_chunks=8, chunk=MiB)
    payload = os.urandom(size)
    try:
        parts = encode(0, -1, payload)
        # The first receive of a size may warm the heap (serialization's "Warm heap": one
        # untouched buffer, freed at once); the one-copy property holds for every receive.
        writer.write(1, parts, time.monotonic() + 5)
        first = reader.read(time.monotonic() + 5)
        assert first is not None and decode(first[1]) == payload
        del first
        tracemalloc.start()
        try:
            writer.write(1, parts, time.monotonic() + 5)
            tracemalloc.reset_peak()
            base = tracemalloc.get_traced_memory()[0]
            msg = reader.read(time.monotonic() + 5)
            assert msg is not None
            got = decode(msg[1])
            peak = tracemalloc.get_traced_memory()[1] - base
        finally:
            tracemalloc.stop()
        assert got == payload
        assert size <= peak < size + 64 * KiB, f"{peak} bytes allocated for a {size}-byte reply"
    finally:
        ring.close()


def test_a_damaged_chunk_is_caught_across_split_pieces(ring) -> None:  # type: ignore[no-untyped-def]
    buf, writer, reader = ring[0].buf, ring[1], ring[2]
    writer.write(5, encode(0, -1, os.urandom(3 * CHUNK)), time.monotonic() + 5)
    first = ring[0].datas[0]
    buf[first + 40] ^= 0xFF  # the pickle, inside the first chunk, before the bytes value
    with pytest.raises(CorruptMessageError, match="failed its checksum"):
        reader.read(time.monotonic() + 5)
    writer.write(6, encode(0, -1, b"next"), time.monotonic() + 5)
    got = reader.read(time.monotonic() + 5)
    assert got is not None and got[0] == 6 and decode(got[1]) == b"next"


def test_layouts_that_do_not_add_up_fall_back_to_one_buffer() -> None:
    head = bytearray(encode(0, -1, os.urandom(100 * KiB))[0])
    total = len(head) + 10 + 100 * KiB
    assert frame_layout(memoryview(head), 40) is None  # a small message
    assert frame_layout(memoryview(head), total + 1) is None  # sizes do not add up
    assert frame_layout(memoryview(head)[:10], total) is None  # the head is cut short
    head[5:9] = (1 << 31).to_bytes(4, "little")  # a huge buffer count (header offset 5)
    assert frame_layout(memoryview(head), total) is None


def test_an_interrupted_assembly_resumes_into_the_whole_message() -> None:
    calls: list[int] = []

    def flaky_layout(head: memoryview, total: int) -> Any:
        calls.append(total)
        if len(calls) == 1:
            raise KeyboardInterrupt  # Ctrl-C while the reader plans where the message goes
        return frame_layout(head, total)

    ring = ShmRingBuffer(QueueSpec("large", 1, 8, CHUNK))
    ring.segment.close_fd()
    writer, reader = QueueWriter(ring, [], None), QueueReader(ring, 0, None, None, layout=flaky_layout)
    try:
        payload = os.urandom(3 * CHUNK)
        writer.write(1, encode(0, -1, payload), time.monotonic() + 5)
        with pytest.raises(KeyboardInterrupt):
            reader.read(time.monotonic() + 5, hold=True)
        got = reader.read(time.monotonic() + 5, hold=True)
        assert got is not None and decode(got[1]) == payload and len(calls) == 2
        reader.ack()
    finally:
        ring.close()


def test_executor_echoes_large_values_to_both_workers() -> None:
    cfg = ExecutorConfig(worker="executor.workers:EchoWorker", tensor_parallel_size=2,
                         start_method="fork", chunk_bytes=CHUNK, n_chunks=4)
    with MultiprocExecutor(cfg) as ex:
        for size in (CHUNK - 60, 3 * CHUNK + 1, 2 * MiB):
            for value in _values(size):
                replies = ex.collective_rpc("echo", args=(value,))
                assert len(replies) == 2 and all(_same(value, r) for r in replies), size


def test_a_request_carries_its_trace_context_in_the_header_not_the_pickle() -> None:
    from executor.serialization import TRACE_AT, TRACE_HEADER

    trace_id, span_id = (0xABC << 64) | 0xDEF, 0x1234
    traced = b"".join(encode(1, -1, ("echo", (1,), {}), False, trace_id, span_id, 1))
    plain = b"".join(encode(1, -1, ("echo", (1,), {})))
    assert TRACE_HEADER.unpack_from(traced, TRACE_AT) == (0xABC, 0xDEF, span_id, 1)
    assert TRACE_HEADER.unpack_from(plain, TRACE_AT) == (0, 0, 0, 0)  # parent 0: not traced
    assert decode(traced) == decode(plain) == ("echo", (1,), {})
    assert len(traced) == len(plain)  # a fixed field: the pickle is the same
