"""The ``faultlab`` target: faultlab's own MultiprocExecutor, driven like any other target.

    python -m chaos.targets.faultlab_driver SPEC_JSON
      MultiprocExecutor(EchoWorker-style work, tensor_parallel_size = spec.ranks)
      call i: collective_rpc(work, args=(i, call_s)) ─► [call_value(i, r) for each rank r]
      ready {driver, worker rank r}; invoke/ok/fail per call; error on ExecutorFailedError
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, ClassVar

from chaos.targets.base import FAULT_KINDS, Launch, Target, WorkloadSpec
from chaos.targets.protocol import call_value

_ROOT = str(Path(__file__).resolve().parents[2])


def unit_of_work_values(spec: WorkloadSpec) -> dict[int, Any]:
    """Every call's value when each of ``ranks`` returns ``call_value(i, rank)``."""
    return {i: [call_value(i, r) for r in range(spec.ranks)] for i in range(spec.calls)}


def python_launch(module: str, spec: WorkloadSpec, extra_env: dict[str, str] | None = None) -> Launch:
    """``python -m module SPEC_JSON`` with this interpreter and this checkout on the path."""
    path = os.pathsep.join(p for p in (_ROOT, os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, PYTHONPATH=path, PYTHONUNBUFFERED="1", **(extra_env or {}))
    env.pop("FAULTLAB_TRACE_DIR", None)  # the driver's journal is not the observer's
    return Launch([sys.executable, "-m", module, json.dumps(spec.to_json())], env, _ROOT)


class FaultlabTarget(Target):
    name: ClassVar[str] = "faultlab"
    extra: ClassVar[str] = ""  # faultlab itself: nothing to install
    applies: ClassVar[frozenset[str]] = frozenset(FAULT_KINDS)
    start_timeout_s: ClassVar[float] = 30.0

    def unavailable(self) -> str | None:
        return None

    def launch(self, spec: WorkloadSpec, out_dir: str) -> Launch:
        return python_launch("chaos.targets.faultlab_driver", spec)

    def expected_values(self, spec: WorkloadSpec) -> dict[int, Any] | None:
        return unit_of_work_values(spec)


TARGET = FaultlabTarget()
