"""The ``processpool`` target: the standard library's concurrent.futures.ProcessPoolExecutor.

    python -m chaos.targets.processpool_driver SPEC_JSON
      ProcessPoolExecutor(max_workers = spec.ranks); "rank" r = the r-th worker by pid
      call i: one task per rank, call_value(i, r) after call_s; wait for all of them
      the error the caller sees when a worker dies: BrokenProcessPool
"""

from __future__ import annotations

from typing import Any, ClassVar

from chaos.targets.base import FAULT_KINDS, Launch, Target, WorkloadSpec
from chaos.targets.faultlab_target import python_launch, unit_of_work_values


class ProcessPoolTarget(Target):
    name: ClassVar[str] = "processpool"
    extra: ClassVar[str] = ""  # the standard library
    applies: ClassVar[frozenset[str]] = frozenset(FAULT_KINDS)
    start_timeout_s: ClassVar[float] = 30.0

    def unavailable(self) -> str | None:
        return None

    def launch(self, spec: WorkloadSpec, out_dir: str) -> Launch:
        return python_launch("chaos.targets.processpool_driver", spec)

    def expected_values(self, spec: WorkloadSpec) -> dict[int, Any] | None:
        return unit_of_work_values(spec)


TARGET = ProcessPoolTarget()
