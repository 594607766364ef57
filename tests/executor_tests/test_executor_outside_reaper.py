"""Someone else reaps the workers (issue 25, defect 4), and exit codes given a cause they did
not have (defect 9).

    caller's SIGCHLD ─┬─ SIG_IGN: the kernel reaps every exited child at once
                      └─ a handler looping waitpid(-1, WNOHANG): it reaps them itself
    either way multiprocessing's exitcode/join say "running" forever; the executor must read
    liveness from its pidfds: shutdown fast, no signal to a freed pid, the death named, no fd left

Every test restores the SIGCHLD disposition in a ``finally`` (``reaper_helpers.sigchld``).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import threading
import time

import pytest
from exec_helpers import exit_in_rank, sleep_in_flight
from reaper_helpers import REAPERS, open_fds, sigchld, stranger_at, wait_pid_free, warm_up

from executor import (
    ExecutorConfig,
    ExecutorFailedError,
    MultiprocExecutor,
    WorkerStartupError,
    exits,
    failpoints,
)
from executor.protocol import EXIT_CAUSES

CAUSE_PHRASES = tuple(EXIT_CAUSES.values())
ESCALATION = ("SIGTERM to worker", "SIGKILL to worker")


def _start(start_method: str, **extra: object) -> MultiprocExecutor:
    cfg = ExecutorConfig(tensor_parallel_size=2, start_method=start_method, **extra)  # type: ignore[arg-type]
    return MultiprocExecutor(cfg)


def _timed_shutdown(ex: MultiprocExecutor) -> tuple[float, float]:
    wall, cpu = time.monotonic(), time.process_time()
    ex.shutdown()
    return time.monotonic() - wall, time.process_time() - cpu


def _assert_stopped_cleanly(ex: MultiprocExecutor, fds_before: set[int], wall: float, cpu: float,
                            caplog: pytest.LogCaptureFixture) -> None:
    assert wall < 1.5, f"shutdown took {wall:.2f} s (grace 2 s + SIGTERM 1 s + SIGKILL 5 s before)"
    assert cpu < 0.5, f"shutdown used {cpu:.2f} s of CPU: a busy wait"
    escalated = [r.getMessage() for r in caplog.records if any(e in r.getMessage() for e in ESCALATION)]
    assert not escalated, f"signals sent to workers that had already exited: {escalated}"
    assert open_fds() - fds_before == set(), "descriptors left open after shutdown()"
    for pid in ex.worker_pids:
        assert wait_pid_free(pid, 0.5), f"worker {pid} outlived shutdown()"


# ---------------------------------------------------------------- shutdown

@pytest.mark.parametrize("mode", REAPERS)
def test_shutdown_is_fast_when_sigchld_is_ignored_or_reaped(start_method, mode, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="executor")
    warm_up(start_method)
    fds_before = open_fds()
    ex = _start(start_method)
    assert ex.collective_rpc("echo", args=(1,)) == [1, 1]
    with sigchld(mode):
        wall, cpu = _timed_shutdown(ex)
    _assert_stopped_cleanly(ex, fds_before, wall, cpu, caplog)


@pytest.mark.parametrize("mode", REAPERS)
def test_an_executor_started_under_an_outside_reaper_serves_and_stops(start_method, mode, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="executor")
    warm_up(start_method)
    fds_before = open_fds()
    with sigchld(mode):
        ex = _start(start_method)
        try:
            assert ex.collective_rpc("echo", args=("x",), timeout=10) == ["x", "x"]
            ex.check_health()
        finally:
            wall, cpu = _timed_shutdown(ex)
    _assert_stopped_cleanly(ex, fds_before, wall, cpu, caplog)


@pytest.mark.parametrize("mode", REAPERS)
def test_a_startup_failure_under_an_outside_reaper_is_named_and_cleaned_up(start_method, mode) -> None:
    warm_up(start_method)
    fds_before = open_fds()
    start = time.monotonic()
    with sigchld(mode), pytest.raises(WorkerStartupError) as info:
        _start(start_method, worker="exec_helpers:ExitOnStartWorker")
    assert time.monotonic() - start < 10
    message = str(info.value)
    assert "worker rank 1" in message and "before reporting READY" in message, message
    assert "exited with code 9" in message or "reaped by another handler" in message, message
    assert open_fds() - fds_before == set(), "descriptors left open after a failed start"


# ---------------------------------------------------------------- a death, named

@pytest.mark.parametrize("mode", REAPERS)
def test_worker_death_named_when_an_outside_handler_reaps(start_method, mode, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="executor")
    warm_up(start_method)
    fds_before = open_fds()
    ex = _start(start_method)
    called: list[int] = []
    ex.register_failure_callback(lambda: called.append(1))
    with sigchld(mode):
        thread, errors = sleep_in_flight(ex)
        time.sleep(0.2)
        pid = ex.worker_pids[1]
        start = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        thread.join(10)
        latency = time.monotonic() - start
        with pytest.raises(ExecutorFailedError) as health:
            ex.check_health()
        wall, cpu = _timed_shutdown(ex)
    assert latency < 3, f"the in-flight call failed after {latency:.2f} s"
    [error] = errors
    assert isinstance(error, ExecutorFailedError)
    for message in (str(error), str(health.value)):
        assert "rank 1" in message and str(pid) in message, message
        assert "still running" not in message, message
        assert "killed by SIGKILL" in message or "reaped by another handler" in message, message
    assert error.rank == 1 and error.pid == pid
    assert called == [1]
    _assert_stopped_cleanly(ex, fds_before, wall, cpu, caplog)


def test_check_health_sees_a_death_the_monitor_has_not_reported(start_method: str) -> None:
    ex = _start(start_method)
    try:
        ex._res.monitor.stop()  # type: ignore[union-attr]  # only check_health looks now
        ex._res.monitor.join(5)  # type: ignore[union-attr]
        with sigchld("ignore"):
            pid = ex.worker_pids[0]
            os.kill(pid, signal.SIGKILL)
            assert wait_pid_free(pid), "the kernel did not reap the worker"
            with pytest.raises(ExecutorFailedError, match=rf"rank 0 \(pid {pid}\)") as info:
                ex.check_health()
        assert "still running" not in str(info.value)
    finally:
        ex.shutdown()


# ---------------------------------------------------------------- no signal reaches a stranger

@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_a_stranger_at_a_reaped_workers_pid_survives_shutdown(start_method: str) -> None:
    """The old shutdown waited its grace for workers the kernel had already reaped, then
    SIGTERMed and SIGKILLed their pids: whoever had them by then."""
    ex = _start(start_method, shutdown_grace=2.0, sigterm_grace=1.0)
    pid = ex.worker_pids[1]
    stranger = None
    try:
        with sigchld("ignore"):
            stopper = threading.Thread(target=ex.shutdown)
            stopper.start()
            assert wait_pid_free(pid), "the worker did not exit"
            stranger = stranger_at(pid)
            stopper.join(15)
        if stranger is None:
            pytest.skip("cannot choose the next pid here (ns_last_pid)")
        time.sleep(0.2)
        assert stranger.poll() is None, f"the stranger at pid {pid} was killed: {stranger.returncode}"
    finally:
        ex.shutdown()
        if stranger is not None:
            stranger.kill()
            stranger.wait()


def _exit_at_once() -> None:
    os._exit(0)


def test_signals_go_through_the_pidfd_never_to_a_reused_pid() -> None:
    ctx = multiprocessing.get_context("fork")
    process = ctx.Process(target=_exit_at_once)
    stranger = None
    with sigchld("ignore"):
        process.start()
        fd = os.pidfd_open(process.pid)  # type: ignore[arg-type]
        try:
            assert wait_pid_free(process.pid)  # type: ignore[arg-type]
            stranger = stranger_at(process.pid)  # type: ignore[arg-type]
            if stranger is None:
                pytest.skip("cannot choose the next pid here (ns_last_pid)")
            assert exits.has_ended(process, fd) and exits.ended(process, fd) == exits.Ended(None)
            exits.send_signal(process, fd, signal.SIGKILL)
            time.sleep(0.2)
            assert stranger.poll() is None, "SIGKILL reached the process that reused the pid"
            assert exits.release(process, fd)
        finally:
            os.close(fd)
            if stranger is not None:
                stranger.kill()
                stranger.wait()


# ---------------------------------------------------------------- exit codes: only a reported cause

@pytest.mark.parametrize("code", [3, 4, 5], ids=["code_3_is_not_called_a_startup_failure",
                                                 "code_4_is_not_called_queue_damage",
                                                 "code_5_is_not_called_driver_death"])
def test_user_exit_code(make_executor, code: int) -> None:
    ex = make_executor()
    with pytest.raises(ExecutorFailedError) as info:
        ex.collective_rpc(exit_in_rank, args=(1, code), timeout=30)
    message = str(info.value)
    assert f"worker rank 1 (pid {ex.worker_pids[1]}) exited with code {code};" in message, message
    assert not any(phrase in message for phrase in CAUSE_PHRASES), message
    assert "reported" not in message, message


def _clobber_rpc_seq(ring: object, index: int, msg_id: int, **_: object) -> None:
    if ring.spec.name == "rpc" and msg_id == 2:  # type: ignore[attr-defined]
        ring.buf[ring.metas[index] + 8] ^= 0x40  # type: ignore[attr-defined]


def test_a_worker_that_finds_its_queue_damaged_says_so() -> None:
    """Exit code 4 names the damage only because the worker said so before exiting."""
    ex = _start("fork")
    try:
        assert ex.collective_rpc("echo", args=(1,)) == [1, 1]
        failpoints.enable("queue.before_publish", _clobber_rpc_seq)
        with pytest.raises(ExecutorFailedError):
            ex.collective_rpc("echo", args=(2,), timeout=30)
        failpoints.disable()
        ex.shutdown()  # the first to see the damage fails the executor; the other may be stopped first
        ends = {h.rank: h.ended() for h in ex._res.handles}
        assert exits.Ended(4) in ends.values(), ends
        for handle in ex._res.handles:
            code = ends[handle.rank].code  # type: ignore[union-attr]
            said = "(it reported that it found its shared-memory queue damaged)"
            assert handle.describe_end(code).endswith(said) == (code == 4), handle.describe_end(code)
    finally:
        failpoints.disable()
        ex.shutdown()
