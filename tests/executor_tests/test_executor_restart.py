"""Restart in place: a new incarnation of every worker; the executor object survives.

    fault (SIGKILL, SIGTERM, hang)  ─► in-flight calls fail ─► ex.restart() ─► new pids,
    fresh rings, same executor ─► calls succeed; budget and faults during restart bounded
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from exec_helpers import sleep_in_flight

from executor import ExecutorConfig, ExecutorFailedError, MultiprocExecutor
from executor.restart import backoff_s


def _gone(pids: list[int]) -> bool:
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            pass
    return True


def _sleep_in_thread(ex: MultiprocExecutor) -> tuple[threading.Thread, list[BaseException]]:
    thread, errors = sleep_in_flight(ex)
    time.sleep(0.2)
    return thread, errors


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_restart_after_death_serves_from_new_processes(
        make_executor: Callable[..., MultiprocExecutor], sig: int) -> None:
    ex = make_executor()
    failures: list[int] = []
    ex.register_failure_callback(lambda: failures.append(ex.incarnation))
    old = ex.worker_pids
    thread, errors = _sleep_in_thread(ex)
    os.kill(old[1], sig)
    thread.join(10)
    assert len(errors) == 1 and isinstance(errors[0], ExecutorFailedError)
    ex.restart()
    assert ex.incarnation == 1 and not ex.is_failed
    assert ex.collective_rpc("echo", args=("again",)) == ["again", "again"]
    new = ex.worker_pids
    assert not set(new) & set(old) and _gone(old)
    assert failures == [0]  # the failure ran the callbacks once


def test_restart_of_a_hung_incarnation_fails_its_calls(
        make_executor: Callable[..., MultiprocExecutor]) -> None:
    ex = make_executor(start_method="fork")
    thread, errors = _sleep_in_thread(ex)  # a worker "hangs" in a 30 s call
    ex.restart("step timeout")
    thread.join(10)
    assert len(errors) == 1 and "step timeout" in str(errors[0])
    assert ex.collective_rpc("get_rank") == [0, 1]


def test_callbacks_run_once_per_failed_incarnation(
        make_executor: Callable[..., MultiprocExecutor]) -> None:
    ex = make_executor(start_method="fork")
    seen: list[int] = []
    ex.register_failure_callback(lambda: seen.append(ex.incarnation))
    for _ in range(2):
        os.kill(ex.worker_pids[0], signal.SIGKILL)
        _wait_failed(ex)
        ex.restart()
    late: list[int] = []
    ex.register_failure_callback(lambda: late.append(ex.incarnation))
    assert seen == [0, 1] and late == []
    ex.shutdown()  # a shutdown is no failure
    assert seen == [0, 1] and late == []


def test_budget_spent_leaves_the_executor_failed(
        make_executor: Callable[..., MultiprocExecutor]) -> None:
    ex = make_executor(start_method="fork", restart_budget=1)
    ex.restart()
    with pytest.raises(ExecutorFailedError, match="restart budget spent"):
        ex.restart()
    assert ex.is_failed and ex.incarnation == 1
    with pytest.raises(ExecutorFailedError):
        ex.collective_rpc("echo", args=(1,))


@pytest.mark.parametrize("worker", ["restart_helpers:FlagFailWorker",
                                    "restart_helpers:FlagExitWorker"])
def test_fault_during_restart_counts_and_retries(
        make_executor: Callable[..., MultiprocExecutor], tmp_path: Path, worker: str) -> None:
    flag = tmp_path / "fail"
    ex = make_executor(start_method="fork", worker=worker, restart_budget=3,
                       restart_backoff=0.01, worker_kwargs={"fail_flag": str(flag)})
    flag.touch()
    with pytest.raises(ExecutorFailedError, match="attempt 3") as info:
        ex.restart()
    assert "attempt 1" in str(info.value) and ex.restarts_used == 3 and ex.is_failed
    with pytest.raises(ExecutorFailedError, match="budget spent"):
        ex.restart()


def test_a_restart_whose_every_incarnation_hangs_ends_at_its_own_deadline(
        make_executor: Callable[..., MultiprocExecutor], tmp_path: Path) -> None:
    """Budget 10 x startup_timeout 1 s would be 10 s; restart_timeout=2.5 s ends it sooner."""
    flag = tmp_path / "hang"
    ex = make_executor(start_method="fork", worker="restart_helpers:FlagHangWorker",
                       restart_budget=10, restart_backoff=0.01, startup_timeout=1.0,
                       restart_timeout=2.5, worker_kwargs={"fail_flag": str(flag)})
    flag.touch()
    start = time.monotonic()
    with pytest.raises(ExecutorFailedError, match=r"restart_timeout=2\.5 s") as info:
        ex.restart()
    took = time.monotonic() - start
    assert ex.restarts_used <= 3 and ex.is_failed, (ex.restarts_used, str(info.value))
    assert took < 8.0, took  # 2.5 s plus the shut-down of the hung attempt, on a loaded machine


def test_fault_during_restart_then_success(
        make_executor: Callable[..., MultiprocExecutor], tmp_path: Path) -> None:
    flag = tmp_path / "fail"
    ex = make_executor(worker="restart_helpers:FailOnceWorker",
                       restart_budget=3, restart_backoff=0.3,
                       worker_kwargs={"fail_flag": str(flag)})
    flag.touch()  # the first restart attempt fails (and removes it); the second succeeds
    ex.restart()
    assert ex.restarts_used == 2 and ex.incarnation == 1
    assert ex.collective_rpc("echo", args=(5,)) == [5, 5]


def test_restart_after_shutdown_is_refused(
        make_executor: Callable[..., MultiprocExecutor]) -> None:
    ex = make_executor(start_method="fork")
    ex.shutdown()
    with pytest.raises(ExecutorFailedError, match="shut down"):
        ex.restart()


def test_restart_budget_and_backoff_are_validated() -> None:
    with pytest.raises(ValueError, match="restart_budget"):
        ExecutorConfig(restart_budget=-1)
    with pytest.raises(ValueError, match="restart_backoff"):
        ExecutorConfig(restart_backoff=-0.1)
    assert [backoff_s(0.1, 0.3, a) for a in (1, 2, 3)] == [0.1, 0.2, 0.3]


def _wait_failed(ex: MultiprocExecutor) -> None:
    deadline = time.monotonic() + 10
    while not ex.is_failed and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ex.is_failed
