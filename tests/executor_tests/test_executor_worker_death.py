"""Worker death: detected at once, reported with rank, pid and cause, callback once."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from exec_helpers import exit_in_rank, sleep_in_flight

from executor import ExecutorFailedError, MultiprocExecutor


@pytest.mark.parametrize(("sig", "phrase"), [(signal.SIGKILL, "killed by SIGKILL"),
                                             (signal.SIGTERM, "after SIGTERM")])
def test_in_flight_call_fails_at_once_naming_rank_pid_and_signal(executor, sig, phrase) -> None:  # type: ignore[no-untyped-def]
    called: list[int] = []
    callback_ran = threading.Event()
    executor.register_failure_callback(lambda: (called.append(1), callback_ran.set()))
    thread, errors = sleep_in_flight(executor)
    time.sleep(0.2)
    pid = executor.worker_pids[1]
    start = time.monotonic()
    os.kill(pid, sig)
    thread.join(10)
    assert time.monotonic() - start < 5  # not at the call's 60 s timeout
    assert len(errors) == 1 and isinstance(errors[0], ExecutorFailedError)
    message = str(errors[0])
    assert "rank 1" in message and str(pid) in message and phrase in message
    assert executor.is_failed
    assert callback_ran.wait(10)  # after the executor has shut down, from the monitor thread
    assert called == [1]


@pytest.mark.ray_contract
def test_calls_after_death_fail_and_callbacks_run_once(executor: MultiprocExecutor) -> None:
    called: list[int] = []
    executor.register_failure_callback(lambda: called.append(1))
    with pytest.raises(ExecutorFailedError, match="rank 0"):
        executor.collective_rpc(exit_in_rank, args=(0, 3))
    with pytest.raises(ExecutorFailedError):
        executor.collective_rpc("echo", args=(1,))
    with pytest.raises(ExecutorFailedError):
        executor.check_health()
    executor.shutdown()
    assert called == [1]
    late: list[int] = []
    executor.register_failure_callback(lambda: late.append(1))
    assert late == [1]  # registered after the failure: called at once


def test_pending_futures_fail_when_a_worker_dies(executor: MultiprocExecutor) -> None:
    futures = [executor.collective_rpc("sleep", args=(5,), non_block=True) for _ in range(3)]
    os.kill(executor.worker_pids[0], signal.SIGKILL)
    for future in futures:
        with pytest.raises(ExecutorFailedError, match="SIGKILL"):
            future.result(timeout=10)


def test_check_health_passes_while_workers_live(executor: MultiprocExecutor) -> None:
    executor.check_health()
    assert not executor.is_failed


def test_worker_death_while_a_large_request_streams(make_executor) -> None:  # type: ignore[no-untyped-def]
    ex = make_executor(chunk_bytes=64 << 10, n_chunks=4)
    ex.collective_rpc("sleep", args=(30,), unique_reply_rank=0, non_block=True)  # rank 0 stops reading
    big = bytes(8 << 20)  # 128 chunks through a 4-chunk ring: the writer waits on rank 0
    threading.Timer(0.3, os.kill, args=(ex.worker_pids[0], signal.SIGKILL)).start()
    start = time.monotonic()
    with pytest.raises(ExecutorFailedError, match="rank 0"):
        ex.collective_rpc("nbytes", args=(big,), timeout=60)
    assert time.monotonic() - start < 10


def test_worker_death_while_a_large_reply_streams(make_executor) -> None:  # type: ignore[no-untyped-def]
    ex = make_executor(chunk_bytes=64 << 10, n_chunks=4)
    big_then_die = lambda w: bytes(32 << 20) if w.rank == 1 else None  # noqa: E731
    future = ex.collective_rpc(big_then_die, non_block=True)  # nobody reads: rank 1's ring fills
    time.sleep(0.5)
    os.kill(ex.worker_pids[1], signal.SIGKILL)
    with pytest.raises(ExecutorFailedError, match="rank 1"):
        future.result(timeout=30)


def _open_fds() -> set[int]:
    return {int(fd) for fd in os.listdir("/proc/self/fd")}


def test_no_descriptor_leaks_after_a_death(make_executor) -> None:  # type: ignore[no-untyped-def]
    make_executor().shutdown()  # warm up whatever multiprocessing keeps (forkserver, tracker)
    before = _open_fds()
    ex = make_executor()
    os.kill(ex.worker_pids[1], signal.SIGKILL)
    with pytest.raises(ExecutorFailedError):
        ex.collective_rpc("sleep", args=(5,), timeout=30)
    ex.shutdown()
    leaked = {fd: os.readlink(f"/proc/self/fd/{fd}") for fd in _open_fds() - before}
    assert leaked == {}


def test_the_death_error_keeps_its_facts_as_fields_and_through_pickle(executor: MultiprocExecutor) -> None:
    import pickle

    pid = executor.worker_pids[1]
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(ExecutorFailedError) as info:
        executor.collective_rpc("sleep", args=(10,), timeout=10)
    error = info.value
    assert (error.rank, error.pid, error.exitcode) == (1, pid, -signal.SIGKILL)
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error) and str(copy) == str(error) and copy.fields() == error.fields()
