"""Any number of calls in flight: the driver drains replies while the request ring is full."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

import pytest

from executor import MultiprocExecutor, QueueFullError


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
