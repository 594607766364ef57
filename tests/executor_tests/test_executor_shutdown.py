"""Shutdown: idempotent, escalating, complete; also at garbage collection."""

from __future__ import annotations

import gc
import logging
import os
import signal
import threading
import time

import psutil
import pytest
from exec_helpers import ignore_sigterm_and_sleep

from executor import ExecutorConfig, ExecutorFailedError, MultiprocExecutor, failpoints


def _gone(pids: list[int]) -> bool:
    return not [p for p in pids if psutil.pid_exists(p)
                and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


@pytest.mark.ray_contract
def test_shutdown_is_idempotent_and_complete(executor: MultiprocExecutor) -> None:
    pids = executor.worker_pids
    executor.shutdown()
    executor.shutdown()
    with executor:
        pass
    assert _gone(pids)
    with pytest.raises(ExecutorFailedError, match="shut down"):
        executor.collective_rpc("echo", args=(1,))


@pytest.mark.ray_contract
def test_pending_futures_fail_at_shutdown(executor: MultiprocExecutor) -> None:
    futures = [executor.collective_rpc("sleep", args=(5,), non_block=True) for _ in range(3)]
    executor.shutdown()
    for future in futures:
        with pytest.raises(ExecutorFailedError):
            future.result(timeout=5)


def test_worker_crash_during_shutdown(executor: MultiprocExecutor) -> None:
    futures = [executor.collective_rpc("sleep", args=(5,), non_block=True) for _ in range(2)]
    killer = threading.Thread(target=os.kill, args=(executor.worker_pids[0], signal.SIGKILL))
    killer.start()
    executor.shutdown()
    killer.join()
    for future in futures:
        with pytest.raises(ExecutorFailedError):
            future.result(timeout=5)


def _stall_death_pipe(worker: object) -> None:
    failpoints.enable("worker.death_pipe", lambda **_: time.sleep(60))


def test_shutdown_escalates_to_sigkill(make_executor) -> None:  # type: ignore[no-untyped-def]
    ex = make_executor(shutdown_grace=0.2, sigterm_grace=0.2)
    pids = ex.worker_pids
    ex.collective_rpc(_stall_death_pipe)
    ex.collective_rpc(ignore_sigterm_and_sleep, args=(60,), non_block=True)
    time.sleep(0.2)
    start = time.monotonic()
    ex.shutdown()
    assert time.monotonic() - start < 10
    assert _gone(pids)


def test_garbage_collection_shuts_down(start_method: str) -> None:
    ex = MultiprocExecutor(ExecutorConfig(tensor_parallel_size=2, start_method=start_method))
    pids = ex.worker_pids
    assert ex.collective_rpc("echo", args=(1,)) == [1, 1]
    del ex
    gc.collect()
    assert _gone(pids)


def test_busy_workers_shut_down_quickly(executor: MultiprocExecutor) -> None:
    executor.collective_rpc("sleep", args=(30,), non_block=True)
    time.sleep(0.2)
    start = time.monotonic()
    executor.shutdown()
    assert time.monotonic() - start < 5  # SIGTERM interrupts the sleep; no 30 s wait


def test_sigint_makes_a_worker_exit_cleanly(executor: MultiprocExecutor) -> None:
    pid = executor.worker_pids[0]
    os.kill(pid, signal.SIGINT)
    with pytest.raises(ExecutorFailedError, match="after SIGINT"):
        executor.collective_rpc("sleep", args=(10,), timeout=30)


class _SlowHandler(logging.Handler):
    """Holds the monitor thread inside its failure report for a moment."""

    def emit(self, record: logging.LogRecord) -> None:
        if "executor failed" in record.getMessage():
            time.sleep(0.5)


def test_shutdown_racing_the_monitors_own_shutdown(executor: MultiprocExecutor) -> None:
    handler = _SlowHandler()
    logging.getLogger("executor").addHandler(handler)
    try:
        os.kill(executor.worker_pids[0], signal.SIGKILL)
        time.sleep(0.2)  # the monitor is now inside its failure report
        start = time.monotonic()
        executor.shutdown()  # first in: it joins the monitor, which must not wait for it
        assert time.monotonic() - start < 3
    finally:
        logging.getLogger("executor").removeHandler(handler)


def test_a_second_executor_does_not_hold_the_firsts_workers(make_executor) -> None:  # type: ignore[no-untyped-def]
    first = make_executor(shutdown_grace=10.0)
    make_executor()  # under fork its workers copy every fd the driver has open
    start = time.monotonic()
    first.shutdown()
    assert time.monotonic() - start < 5  # the death pipe reached EOF: no wait for the grace


def _finalizer_that_sleeps(worker: object) -> int:
    class Slow:
        def __del__(self) -> None:
            time.sleep(1.0)  # a SIGTERM now raises SystemExit inside __del__: it is swallowed

    slow = Slow()
    del slow
    return 0


def test_sigterm_swallowed_by_a_finalizer_still_ends_the_worker(executor: MultiprocExecutor) -> None:
    failed = threading.Event()
    executor.register_failure_callback(failed.set)
    executor.collective_rpc(_finalizer_that_sleeps, non_block=True)
    time.sleep(0.3)
    os.kill(executor.worker_pids[0], signal.SIGTERM)
    assert failed.wait(10), "the worker kept serving after SIGTERM"
    with pytest.raises(ExecutorFailedError, match="after SIGTERM"):
        executor.check_health()
