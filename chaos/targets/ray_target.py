"""The ray target: one Ray actor per rank on a local, loopback-only Ray, driven by
chaos/targets/ray_driver.py with this venv's Python."""

from __future__ import annotations

import importlib.util
import os
from typing import Any

from chaos.targets import peer_workload as pw
from chaos.targets.base import FAULT_KINDS, Launch, Target, WorkloadSpec

_RAY_TMP = os.environ.get("RAY_TMPDIR") or os.environ.get("TMPDIR") or "/tmp"


class RayTarget(Target):
    name = "ray"
    extra = "targets"
    # damage_shm: the plasma object store (an unlinked /dev/shm file of OBJECT_STORE_BYTES,
    # mapped by the driver among others).  The workload's values are small, so they travel
    # inline, not through plasma.
    applies = frozenset(FAULT_KINDS)
    # Ray never removes its session directories (logs, sockets, port files): under
    # $RAY_TMPDIR, else $TMPDIR, else /tmp (as Ray chooses).
    temp_globs = (os.path.join(_RAY_TMP, "ray", "session_2*"),)
    # ray.init starts gcs_server, raylet, dashboard API server, monitors and agents: ~8 s on
    # two busy cores.
    start_timeout_s = 90.0

    def unavailable(self) -> str | None:
        if importlib.util.find_spec("ray") is None:
            return "ray is not installed: pip install -e '.[targets]'"
        return None

    def launch(self, spec: WorkloadSpec, out_dir: str) -> Launch:
        return pw.launch(self.name, spec)

    def expected_values(self, spec: WorkloadSpec) -> dict[int, Any] | None:
        return pw.expected_values(spec)


TARGET = RayTarget()
