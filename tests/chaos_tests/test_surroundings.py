"""What surrounds the executor (issue 11): Ctrl-C, forks, bursts, callbacks, hostile values,
exhausted resources.  Two halves:

    real executor      each scenario passes: no violation (these fail until the executor
                       itself is fixed: the issue's defects 1-7 and 9)
    broken executors   each oracle reports the defect re-created on top of the executor
                       (chaos/mutants.py), so none of them can pass vacuously
"""

from __future__ import annotations

import threading

import pytest
from helpers import real_violations

from chaos import Bounds, FaultPlan, KillWorker, PlanError, run_scenario
from chaos import mutants as broken
from chaos.faults import ForkInDriver, ForkInWorker, InterruptDriver
from chaos.outcomes import TINY_CHUNKS, Outcome
from chaos.workload_names import BUILTIN
from chaos.workloads import standard
from executor import ExecutorConfig

HIT = ("sleep", 1)


def _cfg(start_method: str = "fork", **extra: object) -> ExecutorConfig:
    return ExecutorConfig(tensor_parallel_size=2, start_method=start_method, **extra)  # type: ignore[arg-type]


# ---------------------------------------------------------------- the real executor

INTERRUPTS = [
    pytest.param(InterruptDriver(on_call=HIT), "standard", {}, id="after-send"),
    pytest.param(InterruptDriver(on_call=HIT, phase="mid_request"), "standard", TINY_CHUNKS,
                 id="mid-request"),
    pytest.param(InterruptDriver(on_call=HIT, phase="before_unpickle_reply"), "standard", {},
                 id="before-unpickling"),
    pytest.param(InterruptDriver(rank=1, on_call=("echo", 2), phase="mid_reply"),
                 "interrupt_stream", {}, id="mid-reply"),
    pytest.param(InterruptDriver(at=(0.05, 0.6)), "interrupt_stream", {}, id="at-a-time"),
]


@pytest.mark.parametrize(("fault", "workload", "extra"), INTERRUPTS)
def test_ctrl_c_reaches_the_caller_and_the_executor_stays_in_step(tmp_path, fault, workload, extra):
    result = run_scenario(_cfg(**extra), BUILTIN[workload], FaultPlan([fault], seed=2), tmp_path)
    assert result.faults, "the SIGINT was never sent"
    assert real_violations(result) == []
    assert result.outcome in (Outcome.INTERRUPT, Outcome.RECOVER)
    assert result.calls[-1].outcome == "ok"  # in step: the probe after the interrupt


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
@pytest.mark.parametrize("mode", ["exit", "linger", "call"])
def test_a_forked_child_of_the_driver_changes_nothing_in_the_parent(tmp_path, mode, start_method):
    fault = ForkInDriver(on_call=HIT, mode=mode, duration=0.3)
    result = run_scenario(_cfg(start_method), BUILTIN["steady"], FaultPlan([fault], seed=2), tmp_path)
    [record] = result.faults
    assert record["kind"] == "fork_in_driver"
    assert real_violations(result) == []
    assert result.outcome == Outcome.RECOVER


def test_a_worker_death_is_seen_whatever_its_grandchild_holds(tmp_path):
    fault = ForkInWorker(rank=1, on_call=HIT, duration=20.0)
    result = run_scenario(_cfg(), standard, FaultPlan([fault], seed=2), tmp_path)
    assert real_violations(result) == []
    assert result.outcome == Outcome.FAIL_FAST
    assert result.detection_latency_s is not None and result.detection_latency_s < 3.0


@pytest.mark.parametrize("workload", ["burst", "callback_chaos", "hostile_values", "fd_limit",
                                      "memory_cap"])
def test_edge_workloads_pass(tmp_path, workload):
    result = run_scenario(_cfg(enqueue_timeout=10.0), BUILTIN[workload], FaultPlan([], seed=2),
                          tmp_path)
    assert real_violations(result) == []
    declared = [c for c in result.calls if c.expect_errors is not None or c.non_block]
    assert declared, "the workload declared nothing to check"


def test_ten_thousand_outstanding_calls_complete_in_order(tmp_path):
    result = run_scenario(_cfg(enqueue_timeout=10.0), BUILTIN["burst_10k"], FaultPlan([], seed=2),
                          tmp_path)
    assert real_violations(result) == []
    assert len(result.calls) == 10_000
    assert all(c.outcome == "ok" for c in result.calls)


# ---------------------------------------------------------------- the oracles fail on broken executors

ROWS = [
    ("callbacks", broken.PoisonedByAggregator, "callback_chaos", []),
    ("callbacks", broken.CallbacksUnderLock, "done_callbacks", []),
    ("callbacks", broken.StopsAtRaisingCallback, "failure_callbacks", []),
    ("callback", broken.SkipsCallbacks, "standard", [KillWorker(rank=1, on_call=HIT)]),
    ("interrupt", broken.InterruptAsUnpicklingError, "standard", [InterruptDriver(on_call=HIT)]),
    ("fork", broken.ChildKillsWorkers, "steady", [ForkInDriver(on_call=HIT)]),
    ("detection", broken.SwallowsDeath, "standard", [ForkInWorker(rank=1, on_call=HIT)]),
    ("backpressure", broken.QueueFullAfter10, "burst", []),
    ("hostile", broken.HostileKillsWorker, "hostile_values", []),
    ("leak", broken.LeaksOnFailedStart, "fd_limit", []),
]


@pytest.mark.parametrize(("invariant", "cls", "workload", "faults"), ROWS,
                         ids=[f"{r[0]}-{r[1].__name__}" for r in ROWS])
def test_oracle_catches_broken_surroundings(tmp_path, invariant, cls, workload, faults):
    try:
        result = run_scenario(_cfg(), BUILTIN[workload], FaultPlan(faults, seed=1), tmp_path,
                              executor_class=cls, bounds=Bounds(detect_s=1.0))
    finally:
        for fd in broken.LeaksOnFailedStart.kept:
            __import__("os").close(fd)
        broken.LeaksOnFailedStart.kept.clear()
    assert invariant in {v.invariant for v in result.violations}, result.violations


# ---------------------------------------------------------------- plans

def test_an_interrupt_plan_is_refused_off_the_main_thread(tmp_path):
    errors: list[BaseException] = []

    def run() -> None:
        try:
            run_scenario(_cfg(), standard, FaultPlan([InterruptDriver(at=0.1)]), tmp_path)
        except PlanError as exc:
            errors.append(exc)

    t = threading.Thread(target=run)
    t.start()
    t.join(30)
    assert errors and "main thread" in str(errors[0])


def test_new_fault_kinds_check_their_fields():
    with pytest.raises(PlanError, match="mode must be one of"):
        ForkInDriver(mode="explode")
    with pytest.raises(PlanError, match="phase must be one of"):
        InterruptDriver(phase="before_execute")
    with pytest.raises(PlanError, match="duration"):
        ForkInWorker(duration=-1)
