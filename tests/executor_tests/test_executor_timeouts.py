"""Timeouts: a deadline for the whole call; a late reply never reaches a later call."""

from __future__ import annotations

import time

import pytest

from executor import MultiprocExecutor

SLACK = 0.5  # scheduling slack on a loaded 2-core machine; the point is "not at 5 s"


@pytest.mark.ray_contract
def test_timeout_raises_at_the_deadline(executor: MultiprocExecutor) -> None:
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"timed out after 0\.2 s"):
        executor.collective_rpc("sleep", args=(3,), timeout=0.2)
    assert time.monotonic() - start < 0.2 + SLACK


@pytest.mark.ray_contract
def test_late_reply_is_never_returned_to_a_later_call(executor: MultiprocExecutor) -> None:
    with pytest.raises(TimeoutError):
        executor.collective_rpc("sleep", args=(0.5,), timeout=0.1)
    # The sleep's late replies [0.5, 0.5] arrive while this call waits: they must be dropped.
    assert executor.collective_rpc("echo", args=("fresh",), timeout=10) == ["fresh", "fresh"]


def test_timeout_with_one_slow_rank(executor: MultiprocExecutor) -> None:
    slow = lambda w: time.sleep(1.0 if w.rank == 1 else 0) or w.rank  # noqa: E731
    with pytest.raises(TimeoutError, match="rank 1"):
        executor.collective_rpc(slow, timeout=0.3)
    assert executor.collective_rpc("get_rank", timeout=10) == [0, 1]


def test_non_blocking_call_times_out_from_submission(executor: MultiprocExecutor) -> None:
    future = executor.collective_rpc("sleep", args=(2,), timeout=0.2, non_block=True)
    time.sleep(0.3)
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        future.result()
    assert time.monotonic() - start < SLACK


def test_blocking_call_behind_a_slow_future_keeps_its_own_deadline(executor: MultiprocExecutor) -> None:
    slow = executor.collective_rpc("sleep", args=(1.5,), non_block=True)
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        executor.collective_rpc("echo", args=(1,), timeout=0.2)
    assert time.monotonic() - start < 0.2 + SLACK
    assert slow.result(timeout=10) == [1.5, 1.5]


def test_writer_gives_up_on_a_reader_that_does_not_read(make_executor) -> None:  # type: ignore[no-untyped-def]
    ex = make_executor(chunk_bytes=64 << 10, n_chunks=2, enqueue_timeout=0.5)
    only_rank_1_sleeps = lambda w: time.sleep(2 if w.rank == 1 else 0) or w.rank  # noqa: E731
    busy = ex.collective_rpc(only_rank_1_sleeps, non_block=True)
    with pytest.raises(TimeoutError, match=r"reader\(s\) \[1\]"):
        ex.collective_rpc("nbytes", args=(bytes(1 << 20),))
    assert busy.result(timeout=30) == [0, 1]
    # The half-sent message was closed with an abort marker: the queue is still in step.
    assert ex.collective_rpc("echo", args=("after",), timeout=30) == ["after", "after"]
