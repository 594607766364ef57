"""Aggregators, done-callbacks and failure callbacks: user code run by the executor.

An aggregator that raises fails its own call only; a future's done-callback may call the
executor; every way of failing runs each failure callback exactly once, and one registered
on a failed executor runs at once."""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import pytest

from executor import ExecutorFailedError, MultiprocExecutor

sys.path.insert(0, os.path.dirname(__file__))
import outsider_helpers as helpers


def _divide_by_zero(values: list[Any]) -> Any:
    return 1 / 0


def test_a_raising_aggregator_fails_only_its_own_call(executor: MultiprocExecutor) -> None:
    with pytest.raises(ZeroDivisionError):
        executor.collective_rpc("echo", args=(1,), aggregator=_divide_by_zero)
    future = executor.collective_rpc("echo", args=(2,), aggregator=_divide_by_zero, non_block=True)
    assert isinstance(future.exception(timeout=10), ZeroDivisionError)
    assert executor.collective_rpc("echo", args=(3,), aggregator=sum) == 6
    assert executor.collective_rpc("echo", args=(4,)) == [4, 4]
    assert not executor.is_failed


def test_a_done_callback_may_call_the_executor(executor: MultiprocExecutor) -> None:
    seen: list[Any] = []

    def callback(future: Future) -> None:
        seen.append(executor.collective_rpc("echo", args=([*future.result(), 1],), timeout=10))

    futures = [executor.collective_rpc("echo", args=(i,), non_block=True) for i in range(5)]
    for future in futures:
        future.add_done_callback(callback)
    assert [f.result(timeout=10) for f in futures] == [[i, i] for i in range(5)]
    assert sorted(seen) == [[[i, i, 1]] * 2 for i in range(5)]  # callbacks nest: any order


def test_a_sent_call_cannot_be_cancelled(executor: MultiprocExecutor) -> None:
    future = executor.collective_rpc("sleep", args=(0.05,), non_block=True)
    assert future.cancel() is False
    assert future.result(timeout=10) == [0.05, 0.05]


def _counting_callback() -> tuple[list[int], threading.Event, Callable[[], None]]:
    calls: list[int] = []
    done = threading.Event()

    def callback() -> None:
        calls.append(1)
        done.set()

    return calls, done, callback


def _kill_rank_1(ex: MultiprocExecutor) -> None:
    os.kill(ex.worker_pids[1], signal.SIGKILL)


def _damage_a_reply(ex: MultiprocExecutor) -> None:
    ex.collective_rpc(helpers.damage_next_reply_meta, args=(1, 8), timeout=10)  # its seq field


@pytest.mark.parametrize("failure", [_kill_rank_1, _damage_a_reply], ids=["worker-death", "queue-damage"])
def test_every_failure_runs_each_callback_once_and_late_ones_at_once(
    make_executor: Callable[..., MultiprocExecutor], failure: Callable[[MultiprocExecutor], None]
) -> None:
    ex = make_executor()
    calls, done, callback = _counting_callback()
    ex.register_failure_callback(callback)
    ex.register_failure_callback(lambda: 1 / 0)  # a raising callback is logged, never fatal
    with pytest.raises(ExecutorFailedError):
        failure(ex)
        ex.collective_rpc("sleep", args=(10,), timeout=10)
    assert done.wait(10), "the failure callback never ran"
    late, late_done, late_callback = _counting_callback()
    ex.register_failure_callback(late_callback)
    assert late_done.is_set(), "a callback registered on a failed executor must run at once"
    ex.shutdown()
    assert calls == [1] and late == [1]


def test_shutdown_is_not_a_failure(executor: MultiprocExecutor) -> None:
    calls, _, callback = _counting_callback()
    executor.register_failure_callback(callback)
    executor.shutdown()
    executor.register_failure_callback(callback)
    assert calls == []
