"""The pebble target: ``pebble.ProcessPool``, driven by chaos/targets/pebble_driver.py with
this venv's Python."""

from __future__ import annotations

import importlib.util
from typing import Any

from chaos.targets import peer_workload as pw
from chaos.targets.base import FAULT_KINDS, Launch, Target, WorkloadSpec


class PebbleTarget(Target):
    name = "pebble"
    extra = "targets"
    # damage_shm: the pool's two semaphores (its channels' locks: /dev/shm files unlinked
    # at birth, mapped by the driver and its forked workers) are all the shared memory there is.
    applies = frozenset(FAULT_KINDS)
    start_timeout_s = 30.0

    def unavailable(self) -> str | None:
        if importlib.util.find_spec("pebble") is None:
            return "pebble is not installed: pip install -e '.[targets]'"
        return None

    def launch(self, spec: WorkloadSpec, out_dir: str) -> Launch:
        return pw.launch(self.name, spec)

    def expected_values(self, spec: WorkloadSpec) -> dict[int, Any] | None:
        return pw.expected_values(spec)


TARGET = PebbleTarget()
