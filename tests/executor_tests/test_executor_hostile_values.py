"""Hostile values: exceptions whose __str__ raises, whose pickling calls sys.exit, unpicklable
ones, in a method or in a worker's __init__.  The caller gets what can be captured; the worker
keeps serving."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable

import pytest

from executor import (
    ExecutorConfig,
    MultiprocExecutor,
    RequestPicklingError,
    WorkerError,
    WorkerStartupError,
)

sys.path.insert(0, os.path.dirname(__file__))
import outsider_helpers as helpers


@pytest.mark.parametrize(("method", "type_name", "phrase"), [
    (helpers.raise_str_raises, "StrRaises", "str() of StrRaises raised RuntimeError"),
    (helpers.raise_reduce_exits, "ReduceExits", "cannot travel"),
    (helpers.return_reduce_exits, "SystemExit", "could not pickle the reply"),
])
def test_a_hostile_exception_becomes_a_worker_error_and_the_worker_serves_on(
    make_executor: Callable[..., MultiprocExecutor], method: Callable[..., object],
    type_name: str, phrase: str,
) -> None:
    ex = make_executor()
    with pytest.raises(WorkerError) as info:
        ex.collective_rpc(method, timeout=10)
    assert type_name in info.value.exc_type
    assert phrase in str(info.value)
    assert info.value.remote_traceback
    assert ex.collective_rpc("echo", args=(1,), timeout=10) == [1, 1]


def test_a_hostile_exception_in_worker_init_keeps_its_traceback(start_method: str) -> None:
    cfg = ExecutorConfig(worker="outsider_helpers:HostileInitWorker", start_method=start_method)
    with pytest.raises(WorkerStartupError, match="StrRaises") as info:
        MultiprocExecutor(cfg)
    assert "in __init__" in str(info.value)  # the traceback reached the driver


class _ExitWhenPickled:
    def __reduce__(self) -> object:
        raise SystemExit(9)


def test_arguments_whose_pickling_exits_fail_the_call_in_the_caller(executor: MultiprocExecutor) -> None:
    with pytest.raises(RequestPicklingError, match="SystemExit"):
        executor.collective_rpc("echo", args=(_ExitWhenPickled(),))
    with pytest.raises(RequestPicklingError):
        executor.collective_rpc("echo", args=(threading.Lock(),))
    assert executor.collective_rpc("echo", args=(2,)) == [2, 2]
