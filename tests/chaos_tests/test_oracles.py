"""Every invariant fails on a deliberately broken executor: an oracle that cannot fail is
worthless.  Each row: broken executor, workload, fault plan, the invariant that must break."""

from __future__ import annotations

import os

import pytest

from chaos import Bounds, ExitWorker, FaultPlan, KillDriver, KillWorker, run_scenario
from chaos import mutants as broken
from chaos.recording import RecordingExecutor
from executor import ExecutorConfig, MultiprocExecutor

FORK = ExecutorConfig(tensor_parallel_size=2, start_method="fork")
FAST_STOP = ExecutorConfig(tensor_parallel_size=2, start_method="fork", shutdown_grace=0.2,
                           sigterm_grace=0.2)


def sleep_past_deadline(ex):
    try:
        ex.collective_rpc("sleep", args=(2.5,), timeout=0.3)
    except Exception:  # noqa: BLE001
        pass


def echo_calls(ex):
    for i in range(3):
        ex.collective_rpc("echo", args=(i,), timeout=2.0)


def sleeps_with_deadline(ex):
    for _ in range(4):
        try:
            ex.collective_rpc("sleep", args=(0.05,), timeout=0.5)
        except Exception:  # noqa: BLE001
            pass


def sleep_then_echo(ex):
    try:
        ex.collective_rpc("sleep", args=(0.01,), timeout=1.0)
    except Exception:  # noqa: BLE001
        pass
    echo_calls(ex)


def futures_pair(ex):
    fs = [ex.collective_rpc("echo", args=(i,), non_block=True, timeout=2.0) for i in range(4)]
    for f in fs:
        f.result()


def long_sleep(ex):
    try:
        ex.collective_rpc("sleep", args=(20,), timeout=30)
    except Exception:  # noqa: BLE001
        pass


def holds_gil(ex):
    try:
        ex.collective_rpc("hold_gil", args=(30,), timeout=40)
    except Exception:  # noqa: BLE001
        pass


KILL_FIRST_SLEEP = [KillWorker(rank=1, on_call=("sleep", 1))]
ROWS = [
    ("deadline", broken.DropsDeadline, FORK, sleep_past_deadline, [], Bounds(deadline_slack_s=0.5)),
    ("detection", broken.SwallowsDeath, FORK, sleeps_with_deadline, KILL_FIRST_SLEEP, Bounds(detect_s=1.0)),
    ("detection", broken.IgnoresCleanExit, FORK, sleeps_with_deadline,
     [ExitWorker(rank=1, on_call=("sleep", 1))], Bounds(detect_s=1.0)),
    ("callback", broken.CallbackTwice, FORK, sleeps_with_deadline, KILL_FIRST_SLEEP, Bounds()),
    ("results", broken.WrongResults, FORK, echo_calls, [], Bounds()),
    ("results", broken.UndocumentedError, FORK, sleep_then_echo, [], Bounds()),
    ("order", broken.ReversedFutures, FORK, futures_pair, [], Bounds()),
    ("shutdown", broken.SlowShutdown, FAST_STOP, echo_calls, [], Bounds(shutdown_slack_s=0.5)),
    ("leak", broken.LeaksThread, FORK, echo_calls, [], Bounds()),
    ("hang", broken.DropsDeadline, FAST_STOP, long_sleep, [], Bounds(workload_s=1.0)),
    ("orphan", broken.ForgetsDeathPipe, FORK, long_sleep, [KillDriver(at=0.3)], Bounds(exit_s=2.0)),
    ("orphan", broken.NoExitGuard, FORK, holds_gil, [KillDriver(at=0.3)], Bounds(exit_s=2.0)),
]


@pytest.mark.parametrize(("invariant", "cls", "cfg", "workload", "faults", "bounds"), ROWS,
                         ids=[f"{r[0]}-{r[1].__name__}" for r in ROWS])
def test_oracle_catches_broken_executor(invariant, cls, cfg, workload, faults, bounds, tmp_path):
    result = run_scenario(cfg, workload, FaultPlan(faults, seed=1), tmp_path, bounds=bounds,
                          executor_class=cls, expected=None)
    broken_invariants = {v.invariant for v in result.violations}
    assert invariant in broken_invariants, result.violations


@pytest.mark.parametrize(("cfg", "workload", "faults"), [
    (FORK, sleep_past_deadline, []), (FORK, echo_calls, []), (FORK, futures_pair, []),
    (FAST_STOP, echo_calls, []), (FORK, holds_gil, [KillDriver(at=0.3)]),
])
def test_the_real_executor_passes_the_same_checks(cfg, workload, faults, tmp_path):
    result = run_scenario(cfg, workload, FaultPlan(faults, seed=1), tmp_path)
    assert result.violations == []


def test_leaked_shared_memory_is_caught(tmp_path):
    from executor import shm

    class LeaksSegment(MultiprocExecutor):
        def shutdown(self):
            super().shutdown()  # rings are never named: leave a named segment on purpose
            os.close(os.open(os.path.join(shm.SHM_DIR, broken.leaked_segment_name()),
                             os.O_CREAT | os.O_RDWR, 0o600))

    try:
        result = run_scenario(FORK, echo_calls, FaultPlan([], seed=1), tmp_path,
                              executor_class=LeaksSegment)
        assert any("/dev/shm/" in v.message for v in result.violations), result.violations
    finally:
        shm.unlink(broken.leaked_segment_name())


def test_leaked_descriptor_is_caught(tmp_path):
    """An executor that keeps a pipe open after shutdown breaks the fd oracle."""
    kept: list[int] = []

    class LeaksPipe(MultiprocExecutor):
        def shutdown(self) -> None:
            super().shutdown()
            if not kept:
                kept.extend(os.pipe())

    try:
        result = run_scenario(FORK, echo_calls, FaultPlan([], seed=1), tmp_path,
                              executor_class=LeaksPipe)
        assert any("file descriptor" in v.message for v in result.violations), result.violations
    finally:
        for fd in kept:
            os.close(fd)


def test_worker_death_leaves_no_descriptor(tmp_path):
    result = run_scenario(FORK, sleeps_with_deadline, FaultPlan(KILL_FIRST_SLEEP, seed=1), tmp_path)
    assert not [v for v in result.violations if "file descriptor" in v.message]


def test_recording_proxy_logs_each_call(tmp_path):
    with MultiprocExecutor(FORK) as ex:
        proxy = RecordingExecutor(ex)
        proxy.collective_rpc("echo", args=(7,), timeout=1.0)
        f = proxy.collective_rpc("get_rank", non_block=True, unique_reply_rank=1)
        assert f.result() == 1
        pid = os.getpid()
    first, second = proxy.calls
    assert (first.method, first.expected, first.outcome, first.value) == ("echo", [7, 7], "ok", [7, 7])
    assert first.deadline == pytest.approx(first.start + 1.0)
    assert (second.expected, second.value, second.non_block) == (1, 1, True)
    assert second.resolved_seq > first.resolved_seq and pid == os.getpid()


# ---------------------------------------------------------------- damage no call could read
# Found by chaos explore on the real executor (seed 413): a worker SIGSTOPped until the run's
# end is resumed only then, and publishes its damaged late reply after every call has ended.
# Replies are read by the caller that asks, so nothing could see the damage before shutdown.

def _record(faults, call_end_ns, error_type="TimeoutError"):
    from chaos.recording import CallRecord
    from chaos.run_record import RunRecord

    call = CallRecord(0, "echo", ("x",), 0.5, False, None, ["x", "x"], 1_000, 0.0,
                      end=0.5, end_ns=call_end_ns, outcome="error", error_type=error_type)
    return RunRecord(calls=[call], faults=faults)


def _damage(time_ns, queue="reply"):
    return {"index": 1, "kind": "corrupt_queue", "queue": queue, "rank": 0, "pid": 7,
            "time_ns": time_ns, "fatal": True}


@pytest.mark.parametrize(("fault", "due"), [
    (_damage(2_000), False),  # published after the only call ended: unread, no detection due
    (_damage(500), True),  # published while the call still waited: it had to be seen
    (_damage(2_000, queue="rpc"), True),  # a request: the workers read it whenever it comes
    ({"index": 0, "kind": "kill_worker", "rank": 0, "pid": 7, "time_ns": 2_000, "fatal": True},
     True),  # a death after the calls: the monitor sees it with no call at all
])
def test_detection_is_due_only_for_damage_something_could_read(fault, due):
    from chaos.oracles import failure_detected

    violations = failure_detected(_record([fault], call_end_ns=1_500))
    assert [v.invariant for v in violations] == (["detection"] if due else [])


@pytest.mark.parametrize(("error_type", "due"), [("KeyboardInterrupt", False), ("TimeoutError", True)])
def test_a_reply_damaged_while_a_ctrl_c_gave_its_call_up_owes_no_detection(error_type, due):
    """Seed 412 of explore: the reply is damaged while its call runs, then a Ctrl-C ends the
    call (and the workload): nothing asks for the reply.  A call that waited it out had to."""
    from chaos.oracles import failure_detected

    violations = failure_detected(_record([_damage(1_200)], call_end_ns=1_500, error_type=error_type))
    assert [v.invariant for v in violations] == (["detection"] if due else [])


@pytest.mark.parametrize("then_call", [False, True])
def test_a_damaged_late_reply_is_judged_by_whether_a_call_could_read_it(tmp_path, then_call):
    """Rank 0 replies to the first echo 0.5 s late, damaged, after its 0.3 s deadline.  With
    no later call nothing reads it: no detection is due, the run is a deadline.  A later
    call meets the damage and the executor fails fast (detected).  (The outcome table's
    row for a slow worker expects no deadline: the outcome is asserted here instead.)"""
    from chaos import CorruptQueue, SlowWorker

    faults = [SlowWorker(rank=0, phase="before_reply", delay=0.5, on_call=("echo", 1)),
              CorruptQueue(rank=0, queue="reply", mode="clobber_flags", on_call=("echo", 1))]

    def late_reply(ex):
        import time

        for i in range(1 + then_call):
            try:
                ex.collective_rpc("echo", args=(i,), timeout=0.3 if i == 0 else 1.0)
            except Exception:  # noqa: BLE001 - recorded by the proxy
                pass
            time.sleep(0.6)  # the late reply is out by now

    result = run_scenario(FAST_STOP, late_reply, FaultPlan(faults, seed=1), tmp_path,
                          bounds=Bounds(detect_s=1.0), expected=None)  # a slow worker's row
    first = result.calls[0]
    [damage] = [f for f in result.faults if f["kind"] == "corrupt_queue"]
    assert first.error_type == "TimeoutError" and damage["time_ns"] > first.end_ns, result.faults
    assert result.violations == []
    assert result.outcome == ("fail_fast" if then_call else "deadline")
    assert (result.detection_latency_s is not None) == then_call
