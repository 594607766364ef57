"""Futures settle in submission order whichever threads settle them (chaos smoke suite's
futures-then-kill flake: a SIGKILLed worker, the monitor thread failing every pending call,
and the caller asking for the last future while the monitor thread was preempted between
two settlements; the later future settled first).

The ``driver.before_settle`` failpoint stands for that preemption: it stalls the monitor
thread just before it settles the second future, so the interleaving is the same every run.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import pytest

from executor import ExecutorFailedError, MultiprocExecutor, failpoints

STALL_S = 1.0  # long enough for the caller to overtake a stalled settler, if it could


def _stall_settler(rpc_id: int, stalled: threading.Event) -> Callable[..., None]:
    def action(msg_id: int, **_: Any) -> None:
        if msg_id == rpc_id and threading.current_thread() is not threading.main_thread():
            stalled.set()
            time.sleep(STALL_S)
    return action


def _killed_with_settler_stalled(ex: MultiprocExecutor) -> tuple[list[Future[Any]], list[int]]:
    """Four calls in flight, rank 1 SIGKILLed; returns once the thread failing them has
    settled the first future and stalls before the second."""
    futures = [ex.collective_rpc("sleep", args=(30,), non_block=True) for _ in range(4)]
    order: list[int] = []
    for i, future in enumerate(futures):
        future.add_done_callback(lambda f, i=i: order.append(i))
    stalled = threading.Event()
    failpoints.enable("driver.before_settle", _stall_settler(futures[1].call.rpc_id, stalled))  # type: ignore[attr-defined]
    os.kill(ex.worker_pids[1], signal.SIGKILL)
    assert stalled.wait(20), "the monitor thread never began settling the failed futures"
    assert order == [0]
    return futures, order


@pytest.mark.parametrize("start_method", ["fork"], indirect=True)
def test_a_later_future_never_settles_before_an_earlier_one(executor: MultiprocExecutor) -> None:
    try:
        futures, order = _killed_with_settler_stalled(executor)
        with pytest.raises(ExecutorFailedError, match="rank 1"):
            futures[3].result(timeout=20)  # the last one first, as futures_mix asks
        assert [f.done() for f in futures] == [True] * 4, "a later future settled first"
        assert order == [0, 1, 2, 3]
    finally:
        failpoints.disable()


@pytest.mark.parametrize("start_method", ["fork"], indirect=True)
def test_a_call_refused_after_failure_comes_after_the_earlier_futures(
        executor: MultiprocExecutor) -> None:
    try:
        futures, order = _killed_with_settler_stalled(executor)
        with pytest.raises(ExecutorFailedError, match="rank 1"):
            executor.collective_rpc("echo", args=("late",), non_block=True, timeout=20)
        assert [f.done() for f in futures] == [True] * 4, "refused before earlier futures failed"
        assert order == [0, 1, 2, 3]
    finally:
        failpoints.disable()
