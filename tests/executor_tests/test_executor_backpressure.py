"""Any number of calls in flight: the driver drains replies while the request ring is full."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import Any

import pytest

from executor import MultiprocExecutor, QueueFullError, shm_queue


def test_ten_thousand_outstanding_small_calls_complete_in_order(
    make_executor: Callable[..., MultiprocExecutor],
) -> None:
    ex = make_executor()
    futures = [ex.collective_rpc("echo", args=(i,), non_block=True) for i in range(10_000)]
    assert [f.result(timeout=60) for f in futures] == [[i, i] for i in range(10_000)]


def test_two_hundred_outstanding_calls_of_one_mib_complete(
    make_executor: Callable[..., MultiprocExecutor],
) -> None:
    ex = make_executor()
    payloads = [bytes([i % 256]) * (1 << 20) for i in range(200)]
    futures = [ex.collective_rpc("echo", args=(p,), non_block=True) for p in payloads]
    for payload, future in zip(payloads, futures, strict=True):
        assert future.result(timeout=60) == [payload, payload]


def test_queue_full_names_only_a_reader_that_stopped_reading(
    make_executor: Callable[..., MultiprocExecutor],
) -> None:
    ex = make_executor(enqueue_timeout=0.5, n_chunks=4)
    os.kill(ex.worker_pids[1], signal.SIGSTOP)
    try:
        with pytest.raises(QueueFullError, match=r"reader\(s\) \[1\]"):
            for i in range(1000):
                ex.collective_rpc("echo", args=(i,), non_block=True)
    finally:
        os.kill(ex.worker_pids[1], signal.SIGCONT)


def _memfds() -> set[str]:
    """This process's open faultlab memfds (the rings' segments), as 'fd target'."""
    fds = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("/memfd:faultlab"):
            fds.add(f"{fd} {target}")
    return fds


def test_a_kept_ctrl_c_from_inside_the_request_write_does_not_keep_the_ring_mapped(
    make_executor: Callable[..., MultiprocExecutor], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A SIGINT during a chunk's checksum is raised at the first bytecode after the C call,
    inside ``shm_ring.digest``, whose frame holds a slice of the request ring.  The caller
    keeps the KeyboardInterrupt (a REPL keeps ``sys.last_exc``); shutdown must still unmap
    the ring and close its memfd (seen once in CI as a leak after a timed Ctrl-C)."""
    real = shm_queue._digest
    fired: list[bool] = []

    def digest_then_interrupted(data: Any) -> int:
        value = real(data)
        if not fired and len(data) > 64:  # a chunk's data, not its meta
            fired.append(True)
            raise KeyboardInterrupt  # where the signal handler would raise it
        return value

    before = _memfds()
    ex = make_executor()
    monkeypatch.setattr(shm_queue, "_digest", digest_then_interrupted)
    kept: list[BaseException] = []
    try:
        ex.collective_rpc("echo", args=(b"x" * 1000,))
    except KeyboardInterrupt as exc:
        kept.append(exc)
    monkeypatch.setattr(shm_queue, "_digest", real)
    assert kept, "the request write was not interrupted"
    assert ex.collective_rpc("echo", args=(1,), timeout=10) == [1, 1]  # still in step
    ex.shutdown()
    assert _memfds() <= before, "the kept KeyboardInterrupt kept the request ring mapped"


def test_a_kept_error_from_inside_a_reply_read_does_not_keep_the_ring_mapped(
    make_executor: Callable[..., MultiprocExecutor], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A MemoryError while the driver lays out a large reply (its frames hold a slice of the
    reply ring) reaches the caller, who keeps it; shutdown must still unmap the ring."""
    real = shm_queue.partial_for
    fired: list[bool] = []

    def partial_for_out_of_memory(msg_id: int, total: int, head: Any, layout: Any) -> Any:
        if not fired:
            fired.append(True)
            raise MemoryError(f"cannot allocate {total} bytes")  # ``head`` is a ring slice
        return real(msg_id, total, head, layout)

    before = _memfds()
    ex = make_executor()
    monkeypatch.setattr(shm_queue, "partial_for", partial_for_out_of_memory)
    kept: list[BaseException] = []
    try:
        ex.collective_rpc("echo", args=(os.urandom(2 << 20),), timeout=10)
    except MemoryError as exc:
        kept.append(exc)
    monkeypatch.setattr(shm_queue, "partial_for", real)
    assert kept, "the reply was read without the layout failing"
    ex.shutdown()
    assert _memfds() <= before, "the kept MemoryError kept a reply ring mapped"
