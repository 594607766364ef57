"""Chaos that finds round 3's defect classes by itself: an interrupt at every point of the
call path, and fd pressure.

    interrupt_sweep workload   real executor: passes │ chaos.mutants.LocksBeforeTry: the
                                                      │ sweep names the lock left held
    fd_pressure workload       real executor: passes │ chaos.mutants.WaitsInSelect: the call
                                                      │ that waits past 1,024 fds fails
"""

from __future__ import annotations

import pytest
from helpers import real_violations

from chaos import FaultPlan, run_scenario
from chaos import mutants as broken
from chaos.workload_names import BUILTIN
from executor import ExecutorConfig, MultiprocExecutor

FORK = ExecutorConfig(tensor_parallel_size=2, start_method="fork")


@pytest.mark.parametrize("workload", ["interrupt_sweep", "fd_pressure"])
def test_the_real_executor_passes(workload: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    result = run_scenario(FORK, BUILTIN[workload], FaultPlan([], seed=1), tmp_path)
    assert real_violations(result) == []


@pytest.mark.parametrize(("workload", "cls", "says"), [
    ("interrupt_sweep", broken.LocksBeforeTry, "left held"),
    # The driver's select() raises, or a forked worker's does first and it dies (code 1):
    # which of the two the caller meets first is a race (the real executor passes both ways).
    ("fd_pressure", broken.WaitsInSelect, ("filedescriptor out of range", "exited with code 1")),
])
def test_the_workload_catches_the_planted_bug(workload: str, cls: type[MultiprocExecutor],
                                              says: str | tuple[str, ...],
                                              tmp_path) -> None:  # type: ignore[no-untyped-def]
    if cls is broken.LocksBeforeTry:  # the wedged lock would block the scenario's shutdown
        cls = _unwedged(cls)
    result = run_scenario(FORK, BUILTIN[workload], FaultPlan([], seed=1), tmp_path,
                          executor_class=cls, expected=None)
    said = (says,) if isinstance(says, str) else says
    assert any(s in v for v in real_violations(result) for s in said), real_violations(result)


def _unwedged(cls: type[MultiprocExecutor]) -> type[MultiprocExecutor]:
    import threading

    class Unwedged(cls):  # type: ignore[valid-type,misc]
        def shutdown(self) -> None:
            self._res.reply_lock = self._collector.lock = threading.RLock()
            super().shutdown()

    return Unwedged
