"""Broadcast: every rank runs the call; replies come back in rank order or from one rank."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from executor import MultiprocExecutor


@pytest.mark.ray_contract
def test_echo_returns_one_result_per_rank(executor: MultiprocExecutor) -> None:
    assert executor.collective_rpc("echo", args=(b"hi",)) == [b"hi", b"hi"]


@pytest.mark.ray_contract
def test_unique_reply_rank_returns_that_ranks_value(executor: MultiprocExecutor) -> None:
    assert executor.collective_rpc("get_rank", unique_reply_rank=1) == 1
    assert executor.collective_rpc("echo", args=(1,), unique_reply_rank=0) == 1


@pytest.mark.ray_contract
def test_callable_travels_by_cloudpickle(executor: MultiprocExecutor) -> None:
    offset = 10
    assert executor.collective_rpc(lambda w, k: w.rank + k + offset, args=(5,)) == [15, 16]


def test_kwargs_and_aggregator(executor: MultiprocExecutor) -> None:
    assert executor.collective_rpc("echo", kwargs={"x": 3}, aggregator=sum) == 6


def test_worker_pids_are_the_workers(executor: MultiprocExecutor) -> None:
    assert executor.collective_rpc("getpid") == executor.worker_pids


def test_payload_larger_than_a_chunk_and_the_ring(make_executor) -> None:  # type: ignore[no-untyped-def]
    ex = make_executor(chunk_bytes=64 << 10, n_chunks=4)  # a 256 KiB ring
    payload = np.random.default_rng(0).bytes(3 << 20)
    assert ex.collective_rpc("echo", args=(payload,)) == [payload, payload]
    assert ex.collective_rpc("echo", args=(b"small",)) == [b"small", b"small"]


@pytest.mark.ray_contract
def test_tensors_and_arrays_round_trip(executor: MultiprocExecutor) -> None:
    tensor = torch.arange(300_000, dtype=torch.float32).reshape(300, 1000)
    array = np.arange(200_000, dtype=np.int64)
    out_tensor, out_array = executor.collective_rpc("echo", args=((tensor, array),))[0]
    assert torch.equal(out_tensor, tensor) and out_tensor.dtype == torch.float32
    np.testing.assert_array_equal(out_array, array)
    assert executor.collective_rpc("nbytes", args=(tensor,)) == [1_200_000, 1_200_000]


def test_many_calls_stay_in_step(executor: MultiprocExecutor) -> None:
    for i in range(200):
        assert executor.collective_rpc("echo", args=(i,)) == [i, i]


def test_parallel_layout(make_executor) -> None:  # type: ignore[no-untyped-def]
    ex = make_executor(tensor_parallel_size=1, pipeline_parallel_size=2)
    assert ex.output_rank == 1 and ex.max_concurrent_batches == 2
    assert ex.collective_rpc(lambda w: (w.ctx.tp_rank, w.ctx.pp_rank)) == [(0, 0), (0, 1)]


def test_async_scheduling_replies_through_a_thread(make_executor) -> None:  # type: ignore[no-untyped-def]
    ex = make_executor(async_scheduling=True)
    assert ex.max_concurrent_batches == 2
    futures = [ex.collective_rpc("echo", args=(i,), non_block=True) for i in range(20)]
    assert [f.result(timeout=30) for f in futures] == [[i, i] for i in range(20)]
