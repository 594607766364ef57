"""The loky target: loky's reusable process executor (joblib's backend), driven by
chaos/targets/loky_driver.py with this venv's Python."""

from __future__ import annotations

import importlib.util
from typing import Any

from chaos.targets import peer_workload as pw
from chaos.targets.base import FAULT_KINDS, Launch, Target, WorkloadSpec


class LokyTarget(Target):
    name = "loky"
    extra = "targets"
    # damage_shm: loky's named semaphores (/dev/shm/sem.loky-<driver pid>-*, mapped by the
    # workers; listed in ready as shm) and the driver's unlinked ones.
    applies = frozenset(FAULT_KINDS)
    start_timeout_s = 30.0

    def unavailable(self) -> str | None:
        if importlib.util.find_spec("loky") is None:
            return "loky is not installed: pip install -e '.[targets]'"
        return None

    def launch(self, spec: WorkloadSpec, out_dir: str) -> Launch:
        return pw.launch(self.name, spec)

    def expected_values(self, spec: WorkloadSpec) -> dict[int, Any] | None:
        return pw.expected_values(spec)


TARGET = LokyTarget()
