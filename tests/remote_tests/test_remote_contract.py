"""The executor contract across two nodes: the same answers as on one machine."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
from conftest import TwoNodes

from executor import MultiprocExecutor, WorkerError

SLACK_S = 0.5


def test_broadcast_reaches_local_and_remote_ranks(remote_executor: MultiprocExecutor) -> None:
    ex = remote_executor
    assert ex.collective_rpc("echo", args=(b"hi",)) == [b"hi", b"hi"]
    assert ex.collective_rpc(lambda w: w.rank) == [0, 1]
    pids = ex.worker_pids
    assert len(set(pids)) == 2 and os.getpid() not in pids
    assert ex.collective_rpc("getpid") == pids
    assert ex.driver_address is not None and ex.driver_address.startswith("127.0.0.1:")


def test_unique_reply_rank_on_either_node(remote_executor: MultiprocExecutor) -> None:
    assert remote_executor.collective_rpc("get_rank", unique_reply_rank=1) == 1
    assert remote_executor.collective_rpc("get_rank", unique_reply_rank=0) == 0


def test_large_payloads_cross_intact(remote_executor: MultiprocExecutor) -> None:
    blob = os.urandom(1 << 20)
    array = np.arange(300_000, dtype=np.float64)
    assert remote_executor.collective_rpc("echo", args=(blob,), unique_reply_rank=1) == blob
    back = remote_executor.collective_rpc("echo", args=(array,))
    assert all(np.array_equal(a, array) for a in back)


def test_remote_error_is_a_worker_error_and_the_worker_keeps_serving(
    remote_executor: MultiprocExecutor,
) -> None:
    with pytest.raises(WorkerError, match="boom") as info:
        remote_executor.collective_rpc("fail", args=("boom",), unique_reply_rank=1)
    assert info.value.rank == 1 and "ValueError" in info.value.exc_type
    assert "Remote traceback" in str(info.value)
    assert remote_executor.collective_rpc("echo", args=(3,)) == [3, 3]


def test_timeout_at_the_deadline_and_stale_replies_dropped(remote_executor: MultiprocExecutor) -> None:
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        remote_executor.collective_rpc("sleep", args=(1.0,), timeout=0.3, unique_reply_rank=1)
    assert time.monotonic() - start < 0.3 + SLACK_S
    assert remote_executor.collective_rpc("echo", args=("next",)) == ["next", "next"]


def test_futures_resolve_in_order_with_their_own_results(remote_executor: MultiprocExecutor) -> None:
    futures = [remote_executor.collective_rpc("echo", args=(i,), non_block=True) for i in range(8)]
    assert [f.result(timeout=10) for f in reversed(futures)] == [[i, i] for i in reversed(range(8))]


def test_async_scheduling_replies_across_nodes(two_nodes: TwoNodes) -> None:
    ex = two_nodes.start(async_scheduling=True)
    futures = [ex.collective_rpc("echo", args=(i,), non_block=True) for i in range(5)]
    assert [f.result(timeout=10) for f in futures] == [[i, i] for i in range(5)]


def test_four_ranks_two_per_node(two_nodes: TwoNodes) -> None:
    ex = two_nodes.start(tensor_parallel_size=4)
    assert ex.collective_rpc("get_rank") == [0, 1, 2, 3]
    assert ex.collective_rpc("echo", args=(7,), unique_reply_rank=3) == 7
