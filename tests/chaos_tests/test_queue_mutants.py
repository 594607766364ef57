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
from chaos.recording import RecordingExecutor
from chaos.workload_names import BUILTIN
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
