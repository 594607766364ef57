"""The queue's planted bugs inside a whole executor (chaos.mutants' *Executor classes, what
`faultlab chaos explore --mutant` aims at), each caught by a short scenario and its oracles,
and the real executor passing the same scenario.

    mutant                              scenario                      what catches it
    RedoesVisiblePublishExecutor        interrupt_publish             a Ctrl-C after the chunk
                                                                      went visible: readers
                                                                      blamed for damage
    CompletesInvisiblePublishExecutor   interrupt_publish             a Ctrl-C before it went
                                                                      visible: a seq published
                                                                      unwritten
    ProgressOneAheadExecutor            5 non_block sleeps, 2-chunk   the writer waiting on a
      (fork, and spawn: its workers'    request ring                  full ring blames a worker
      readers installed at start-up)                                  that is only behind
                                                                      (fault_free)

The same cuts as swarm faults (``interrupt_driver`` at ``before_publish`` / ``after_written``),
judged as ``faultlab chaos explore`` judges: each catches its writer mutant on a 2-chunk ring
(the swarm's small_ring surrounding) and the real executor passes; and a fault armed for the
interrupted call, which fires only when the next write sends it, is no reason for the
in-step probe to time out (explore met that on the real executor, seed 393).

ProgressOneBehindExecutor has no row: only a damaged read flag on the chunk a stopped reader
read last tells it from the real executor, and no fault kind damages a read flag (the queue
test, tests/executor_tests/test_executor_blind_spots.py, catches its reader class).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from helpers import real_violations

from chaos import FaultPlan, run_scenario
from chaos import mutants as broken
from chaos.explore import judge
from chaos.faults import Fault, HangWorker, InterruptDriver
from chaos.oracles import damage_has_a_cause
from chaos.recording import RecordingExecutor
from chaos.run_record import RunRecord
from chaos.suites import Scenario
from chaos.workload_names import BUILTIN
from chaos.workloads import CallSpec
from executor import ExecutorConfig, MultiprocExecutor

FORK = ExecutorConfig(tensor_parallel_size=2, start_method="fork")


def small_ring(start_method: str) -> ExecutorConfig:
    return ExecutorConfig(tensor_parallel_size=2, start_method=start_method, n_chunks=2,
                          chunk_bytes=4096)


def sleeps_outstanding(ex: RecordingExecutor) -> None:
    """More non_block calls than the request ring has chunks, behind a sleeping worker."""
    futures = [ex.collective_rpc("sleep", args=(0.05 + i * 1e-4,), timeout=3.0, non_block=True)
               for i in range(5)]
    for f in futures:
        try:
            f.result()
        except Exception:  # noqa: BLE001 - recorded by the proxy, judged by the oracles
            pass


Row = tuple[type[MultiprocExecutor], ExecutorConfig, Callable[[Any], None], str]
ROWS: list[Row] = [
    (broken.RedoesVisiblePublishExecutor, FORK, BUILTIN["interrupt_publish"], "read flag reads 0"),
    (broken.CompletesInvisiblePublishExecutor, FORK, BUILTIN["interrupt_publish"],
     "was published but the chunk reads"),
    (broken.ProgressOneAheadExecutor, small_ring("fork"), sleeps_outstanding, "[fault_free]"),
    (broken.ProgressOneAheadExecutor, small_ring("spawn"), sleeps_outstanding, "[fault_free]"),
]
IDS = [f"{r[0].__name__}-{r[1].start_method}" for r in ROWS]


@pytest.mark.parametrize(("cls", "cfg", "workload", "says"), ROWS, ids=IDS)
def test_the_scenario_catches_the_queue_mutant(cls: type[MultiprocExecutor], cfg: ExecutorConfig,
                                               workload: Callable[[Any], None], says: str,
                                               tmp_path: Any) -> None:
    result = run_scenario(cfg, workload, FaultPlan([], seed=1), tmp_path, executor_class=cls)
    found = real_violations(result)
    assert any(says in v for v in found), found


@pytest.mark.parametrize(("cfg", "workload"), [(FORK, BUILTIN["interrupt_publish"]),
                                               (small_ring("fork"), sleeps_outstanding),
                                               (small_ring("spawn"), sleeps_outstanding)],
                         ids=["interrupt-publish", "small-ring-fork", "small-ring-spawn"])
def test_the_real_executor_passes_the_same_scenario(cfg: ExecutorConfig,
                                                    workload: Callable[[Any], None],
                                                    tmp_path: Any) -> None:
    result = run_scenario(cfg, workload, FaultPlan([], seed=1), tmp_path)
    assert real_violations(result) == []


ECHOES = tuple(CallSpec("echo", (f"e{i}",), 2.0) for i in range(4))
FAST = {"shutdown_grace": 0.3, "sigterm_grace": 0.3}
CUT = {"before_publish": broken.CompletesInvisiblePublishExecutor,
       "after_written": broken.RedoesVisiblePublishExecutor}


def _scenario(faults: tuple[Fault, ...], calls: tuple[CallSpec, ...], executor: str = "",
              **config: Any) -> Scenario:
    return Scenario("queue-cut", {"start_method": "fork", **FAST, **config}, faults, "standard",
                    calls, "auto", tuple(range(len(faults))), executor)  # as the swarm's


@pytest.mark.parametrize("phase", sorted(CUT))
def test_a_ctrl_c_inside_a_publish_catches_its_writer_mutant(phase: str, tmp_path: Any) -> None:
    faults = (InterruptDriver(on_call=("echo", 1), phase=phase),)
    mutant = f"chaos.mutants:{CUT[phase].__name__}"
    broken_run = judge(_scenario(faults, ECHOES, mutant, n_chunks=2), 1, tmp_path / "mutant")
    assert "fault_free" in broken_run.signature or "interrupt" in broken_run.signature, \
        broken_run.problems
    real = judge(_scenario(faults, ECHOES, n_chunks=2), 1, tmp_path / "real")
    assert real.problems == [], real.problems


def test_a_fault_armed_for_the_interrupted_call_does_not_time_the_probe_out(tmp_path: Any) -> None:
    """The interrupted call's request goes out with the next write: were it the in-step
    probe's, rank 0 would hang after replying to it, as planned, and time the probe out.
    With a fault other than Ctrl-C planned, the probe is not run and nothing fails."""
    faults = (InterruptDriver(on_call=("echo", 1), phase="before_publish"),
              HangWorker(rank=0, on_call=("echo", 1), phase="after_reply"))
    run = judge(_scenario(faults, ECHOES[:1]), 1, tmp_path)
    assert [f["kind"] for f in run.result.faults] == ["interrupt_driver"]
    assert run.problems == [], run.problems


DAMAGED = ("request queue damaged: queue rpc, chunk 1: reader 0 has read seq 2 but its read "
           "flag reads 0; the shared-memory ring is damaged and cannot be trusted")


@pytest.mark.parametrize(("fired", "violations"), [
    ([], 1), ([{"kind": "resume_worker"}, {"kind": "slow_worker"}], 1),
    ([{"kind": "corrupt_queue"}], 0),
], ids=["no-fault", "harmless-faults", "corrupt-queue"])
def test_a_damage_verdict_needs_a_damage_fault(fired: list[dict[str, Any]], violations: int) -> None:
    """ProgressOneAhead's false alarm beside a harmless fault (seed 2's SIGCONT) is no
    fault_free run, and explore ignores the outcome: this oracle is what names it."""
    run = RunRecord(calls=[], faults=fired, failed_before_shutdown=DAMAGED)
    assert len(damage_has_a_cause(run)) == violations
    assert damage_has_a_cause(RunRecord(calls=[], faults=fired)) == []
