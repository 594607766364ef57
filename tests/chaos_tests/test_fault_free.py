"""No fault fired, nothing may fail (issue 25, defect 6); a planned fault must fire.

    fault plan          the run                                   verdict
    none                a worker os._exits by itself              fault_free violation
    none                the workload calls exit, undeclared       fault_free violation
    none                ... with expect = "fail_fast"             ok
    none                every call as its request asks            ok, observed fault_free
    a kill on call 9    the call never comes                      unfired violation
    ... may_not_fire    the call never comes                      ok, shown as a note

The first rows run real executors; the oracle's rules are also held to hand-made records.
"""

from __future__ import annotations

import dataclasses

import pytest
from helpers import DIES_BY_ITSELF

from chaos import FaultPlan, KillDriver, KillWorker, Outcome, run_scenario
from chaos.edge_oracles import backpressure_honest
from chaos.oracles import RunRecord, fault_free_stays_fault_free, planned_faults_fired
from chaos.recording import UNKNOWN, CallRecord
from chaos.workloads import CallSpec, rpc_sequence
from executor import ExecutorConfig
from faultlab.cli import main

FORK = ExecutorConfig(tensor_parallel_size=2, start_method="fork")
ECHOES = rpc_sequence([CallSpec("echo", (i,), timeout=5.0) for i in range(4)])
EXITS = rpc_sequence([CallSpec("echo", ("warm-up",), timeout=5.0), CallSpec("exit", (0,), timeout=5.0)])


def _invariants(result) -> set[str]:
    return {v.invariant for v in result.violations}


def test_scenario_without_fault_whose_worker_dies_fails(tmp_path):
    cfg = dataclasses.replace(FORK, worker=DIES_BY_ITSELF)
    result = run_scenario(cfg, ECHOES, FaultPlan([], seed=1), tmp_path)
    assert not result.ok
    assert result.expected == Outcome.FAULT_FREE and result.outcome == Outcome.FAIL_FAST
    [failure] = [v for v in result.violations if v.invariant == "fault_free"]
    assert "with no fault fired" in failure.message and "rank 1" in failure.message


def test_workload_that_ends_the_workers_undeclared_fails_and_passes_when_it_says_so(tmp_path):
    result = run_scenario(FORK, EXITS, FaultPlan([], seed=1), tmp_path / "undeclared")
    assert "fault_free" in _invariants(result), result.violations
    said = run_scenario(FORK, EXITS, FaultPlan([], seed=1), tmp_path / "said", expected="fail_fast")
    assert said.ok, said.violations
    assert said.outcome == Outcome.FAIL_FAST


def test_fault_free_run_of_the_real_executor_passes_as_fault_free(tmp_path):
    result = run_scenario(FORK, ECHOES, FaultPlan([], seed=1), tmp_path)
    assert result.ok, result.violations
    assert result.expected == result.outcome == Outcome.FAULT_FREE


def test_planned_fault_that_never_fires_is_reported(tmp_path):
    plan = FaultPlan([KillWorker(rank=1, on_call=("echo", 9))], seed=1)
    result = run_scenario(FORK, ECHOES, plan, tmp_path / "undeclared")
    assert result.unfired == [0]
    [unfired] = [v for v in result.violations if v.invariant == "unfired"]
    assert "planned fault 0 (kill_worker of rank 1, on call 9 of 'echo') never fired" in unfired.message
    declared = run_scenario(FORK, ECHOES, plan, tmp_path / "declared", may_not_fire=[0])
    assert declared.ok, declared.violations
    assert declared.unfired == [0] and declared.may_not_fire == [0]
    assert declared.expected == Outcome.FAULT_FREE


def test_driver_kill_that_never_fires_is_reported(tmp_path):
    plan = FaultPlan([KillDriver(on_call=("sleep", 9))], seed=1)
    result = run_scenario(FORK, ECHOES, plan, tmp_path)
    assert "unfired" in _invariants(result), result.violations


SUITE = """
[suite]
name = "fault-free"
[suite.config]
start_method = "fork"
[[scenario]]
name = "dies-by-itself"
calls = [{{method = "echo", args = [1], timeout = 5.0, repeat = 3}}]
[scenario.config]
worker = "{worker}"
[[scenario]]
name = "may-not-fire"
calls = [{{method = "echo", args = [1], timeout = 5.0}}]
[[scenario.faults]]
kind = "kill_worker"
on_call = ["sleep", 1]
may_not_fire = true
"""


def test_chaos_run_fails_a_suite_whose_worker_dies_with_no_fault(tmp_path, capsys):
    suite = tmp_path / "fault_free.toml"
    suite.write_text(SUITE.format(worker=DIES_BY_ITSELF))
    assert main(["chaos", "run", str(suite), "--out", str(tmp_path / "out")]) == 1
    out = capsys.readouterr().out
    dies = next(line for line in out.splitlines() if line.startswith("dies-by-itself"))
    assert "FAIL" in dies and "fault_free" in dies and "fail_fast" in dies
    assert "[fault_free] the executor failed with no fault fired" in out
    may = next(line for line in out.splitlines() if line.startswith("may-not-fire"))
    assert " ok " in may and "fault_free" in may
    assert "note: planned fault 0 never fired (declared may_not_fire)" in out
    assert "1 passed, 1 failed" in out


# ---------------------------------------------------------------- the rules, on hand-made records

def _call(index: int, method: str, *args: object, timeout: float | None = 1.0, outcome: str = "ok",
          error_type: str = "", start_ns: int = 0, **extra: object) -> CallRecord:
    return CallRecord(index, method, args, timeout, False, None, UNKNOWN, start_ns, 0.0,
                      end=0.1, end_ns=start_ns + 10, outcome=outcome, error_type=error_type,
                      **extra)  # type: ignore[arg-type]


def _run(*calls: CallRecord, **fields: object) -> RunRecord:
    return RunRecord(calls=list(calls), faults=[], expected=Outcome.FAULT_FREE, **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(("call", "broken"), [
    (_call(0, "echo", 1), False),
    (_call(0, "fail", "x", outcome="error", error_type="WorkerError"), False),
    (_call(0, "sleep", 2.0, timeout=0.5, outcome="error", error_type="TimeoutError"), False),
    (_call(0, "sleep", 0.1, timeout=0.5, outcome="error", error_type="TimeoutError"), True),
    (_call(0, "sleep", 2.0, timeout=0.5, outcome="error", error_type="QueueFullError"), False),
    (_call(0, "echo", 1, outcome="error", error_type="QueueFullError"), True),
    (_call(0, "echo", 1, outcome="error", error_type="WorkerError"), True),
    (_call(0, "echo", 1, outcome="error", error_type="CorruptMessageError"), True),
    (_call(0, "echo", 1, outcome="error", error_type="WorkerError",
           expect_errors=frozenset({"WorkerError"})), False),  # declared: declared_outcomes judges
])
def test_fault_free_call_must_end_as_its_request_asks(call, broken):
    assert bool(fault_free_stays_fault_free(_run(call))) is broken


def test_a_late_sleep_may_time_out_waiting_for_room_in_the_ring_only():
    late = _call(0, "sleep", 2.0, timeout=0.5, outcome="error", error_type="QueueFullError")
    echo = _call(1, "echo", 1, outcome="error", error_type="QueueFullError")
    assert backpressure_honest(_run(late)) == []
    assert [v.invariant for v in backpressure_honest(_run(late, echo))] == ["backpressure"]


def test_a_late_sleep_behind_busy_readers_of_a_two_chunk_ring_passes(tmp_path):
    """Explore on the real executor, seed 100 (the small_ring surrounding): three calls fill
    a 2-chunk ring while the workers sleep; a sleep asking to time out after 3.4 ms does so
    waiting for room, as a QueueFullError (a TimeoutError), not what the oracles called it."""
    calls = [CallSpec("sleep", (0.1,), 1.0, True), CallSpec("sleep", (0.1001,), 1.1, True),
             CallSpec("echo", ("c2",), 1.2, True), CallSpec("sleep", (0.0103,), 0.0034, True)]
    cfg = dataclasses.replace(FORK, n_chunks=2)
    result = run_scenario(cfg, rpc_sequence(calls), FaultPlan([], seed=1), tmp_path)
    assert result.calls[3].error_type == "QueueFullError", result.calls[3]
    assert result.violations == []


def test_fault_free_executor_may_fail_only_after_a_call_that_asked_for_it():
    died = _call(1, "echo", 1, outcome="error", error_type="ExecutorFailedError", start_ns=100)
    asked = _call(2, "exit", 0, outcome="error", error_type="ExecutorFailedError", start_ns=200,
                  expect_errors=frozenset({"ExecutorFailedError"}))
    assert fault_free_stays_fault_free(_run(died))  # nothing asked for it
    assert fault_free_stays_fault_free(_run(died, asked))  # it failed before the asking call
    assert not fault_free_stays_fault_free(_run(asked, failed_at_ns=250))
    assert fault_free_stays_fault_free(_run(failed_at_ns=5))  # seen failed, no call needed
    assert fault_free_stays_fault_free(_run(workers_gone=["worker rank 0 (pid 1) is gone"]))
    assert fault_free_stays_fault_free(_run(callback_times_ns=[5]))


def test_fault_free_rules_apply_only_when_no_fault_fired():
    died = _call(0, "echo", 1, outcome="error", error_type="ExecutorFailedError")
    for expected in (Outcome.FAIL_FAST, None):
        assert not fault_free_stays_fault_free(dataclasses.replace(_run(died), expected=expected))
    assert not fault_free_stays_fault_free(_run(died, hung=True))  # never_hung reports a hang


def test_planned_faults_fired_spares_only_what_was_declared():
    planned = [{"index": i, "kind": "slow_worker", "target": "rank 1", "trigger": "t",
                "may_not_fire": i == 1} for i in range(3)]
    run = RunRecord(calls=[], faults=[{"index": 2}], planned=planned)
    assert [v.message.split(" (")[0] for v in planned_faults_fired(run)] == ["planned fault 0"]


def test_may_not_fire_survives_the_saved_scenario_that_replay_reads():
    from chaos.suites import Scenario

    data = {"name": "x", "faults": [{"kind": "slow_worker", "probability": 0.01, "may_not_fire": True},
                                    {"kind": "kill_worker", "on_call": ["sleep", 1]}]}
    scenario = Scenario.from_dict(data, "scenario", {})
    assert scenario.may_not_fire == (0,)
    assert Scenario.from_dict(scenario.to_dict(), "scenario", {}) == scenario
