"""Non-blocking calls: ordered futures, each with exactly its own call's outcome."""

from __future__ import annotations

import concurrent.futures
import time

import pytest

from executor import MultiprocExecutor, WorkerError


def test_non_block_returns_a_future_at_once(executor: MultiprocExecutor) -> None:
    start = time.monotonic()
    future = executor.collective_rpc("sleep", args=(0.3,), non_block=True)
    assert isinstance(future, concurrent.futures.Future)
    assert time.monotonic() - start < 0.25
    assert future.result() == [0.3, 0.3]


@pytest.mark.ray_contract
def test_later_future_first_drains_the_earlier_ones(executor: MultiprocExecutor) -> None:
    futures = [executor.collective_rpc("echo", args=(i,), non_block=True) for i in range(10)]
    assert futures[-1].result() == [9, 9]
    assert all(f.done() for f in futures)
    assert [f.result() for f in futures] == [[i, i] for i in range(10)]


@pytest.mark.ray_contract
def test_each_future_gets_its_own_outcome(executor: MultiprocExecutor) -> None:
    ok = executor.collective_rpc("echo", args=("a",), non_block=True)
    bad = executor.collective_rpc("fail", args=("b",), non_block=True)
    last = executor.collective_rpc("echo", args=("c",), unique_reply_rank=1, non_block=True)
    assert last.result() == "c"
    assert ok.result() == ["a", "a"]
    with pytest.raises(WorkerError, match="b"):
        bad.result()


def test_blocking_call_drains_pending_futures(executor: MultiprocExecutor) -> None:
    pending = [executor.collective_rpc("echo", args=(i,), non_block=True) for i in range(5)]
    assert executor.collective_rpc("echo", args=("now",)) == ["now", "now"]
    assert all(f.done() for f in pending)


def test_result_timeout_leaves_the_future_pending(executor: MultiprocExecutor) -> None:
    future = executor.collective_rpc("sleep", args=(0.6,), non_block=True)
    with pytest.raises(TimeoutError):
        future.result(timeout=0.05)
    assert not future.done()
    assert future.result(timeout=10) == [0.6, 0.6]
    assert future.exception() is None


def test_futures_resolve_in_submission_order(executor: MultiprocExecutor) -> None:
    order: list[int] = []
    futures = []
    for i in range(6):
        future = executor.collective_rpc("echo", args=(i,), non_block=True)
        future.add_done_callback(lambda f, i=i: order.append(i))
        futures.append(future)
    futures[3].result()
    futures[5].result()
    assert order == list(range(6))
