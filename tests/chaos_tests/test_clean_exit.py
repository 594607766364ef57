"""A worker that ends itself with exit code 0 while it serves (chaos.faults.ExitWorker).

    real executor         at each phase the call fails at once: ExecutorFailedError naming
                          the rank, its pid and "exited with code 0", within the detection bound;
                          also half-way through a reply of several chunks (phase mid_reply)
    IgnoresCleanExit      (chaos/mutants.py: code 0 is no death to it) explore's judge, which
                          drops "outcome", reports "detection" (test_oracles.ROWS: the oracle)
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import real_violations

from chaos import Bounds, ExitWorker, FaultPlan, Outcome, run_scenario
from chaos.explore import judge
from chaos.suites import Scenario
from chaos.swarm import CONFIG
from chaos.workloads import CallSpec, rpc_sequence, standard
from executor import ExecutorConfig

HIT = ("sleep", 1)
# The outcome table (chaos.outcomes.TABLE) holds before_execute and after_reply.
PHASES = ("after_dequeue", "before_unpickle", "before_reply")


@pytest.mark.parametrize("phase", PHASES)
def test_a_clean_exit_while_serving_fails_the_call_naming_code_0(tmp_path: Path, phase: str) -> None:
    cfg = ExecutorConfig(tensor_parallel_size=2, start_method="fork")
    fault = ExitWorker(rank=1, on_call=HIT, phase=phase)
    result = run_scenario(cfg, standard, FaultPlan([fault], seed=3), tmp_path)
    [record] = result.faults
    assert record["kind"] == "exit_worker" and record["phase"] == phase
    assert real_violations(result) == []
    assert result.outcome == Outcome.FAIL_FAST
    assert result.detection_latency_s is not None and result.detection_latency_s < Bounds().detect_s
    hit = next(c for c in result.calls if c.method == "sleep")
    assert hit.error_type == "ExecutorFailedError", (hit.outcome, hit.error)
    assert f"rank 1 (pid {record['pid']}) exited with code 0" in hit.error


def test_a_clean_exit_half_way_through_a_reply_fails_the_call(tmp_path: Path) -> None:
    cfg = ExecutorConfig(tensor_parallel_size=2, start_method="fork", chunk_bytes=64 << 10, n_chunks=4)
    calls = [CallSpec("echo", ("warm",), 5.0), CallSpec("echo", ("big",), 5.0, payload_bytes=256 << 10)]
    plan = FaultPlan([ExitWorker(rank=1, on_call=("echo", 2), phase="mid_reply")], seed=3)
    result = run_scenario(cfg, rpc_sequence(calls), plan, tmp_path)
    [record] = result.faults
    assert result.fired_points == {"queue.mid_chunk_write": 1}
    assert real_violations(result) == []
    assert result.calls[1].error_type == "ExecutorFailedError"
    assert f"rank 1 (pid {record['pid']}) exited with code 0" in result.calls[1].error


def _swarm_like(executor: str) -> Scenario:
    """A shrunk explore finding's shape: one on_call fault, calls with deadlines."""
    calls = (CallSpec("echo", ("a",), 0.5), CallSpec("echo", ("b",), 0.5))
    return Scenario("clean-exit", {**CONFIG, "start_method": "fork"},
                    (ExitWorker(rank=0, on_call=("echo", 1), phase="before_reply"),), calls=calls,
                    executor=executor)


@pytest.mark.parametrize(("executor", "caught"), [("", False), ("chaos.mutants:IgnoresCleanExit", True)],
                         ids=["real", "IgnoresCleanExit"])
def test_explore_judges_a_clean_exit(tmp_path: Path, executor: str, caught: bool) -> None:
    verdict = judge(_swarm_like(executor), 1, tmp_path)
    assert verdict.result.faults, "the worker never exited"
    if caught:
        assert "detection" in verdict.signature, verdict.problems
    else:
        assert verdict.problems == []
