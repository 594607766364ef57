"""The ``vllm`` target: the real vLLM engine (CPU build), tensor_parallel_size = spec.ranks,
multi-process executor, run by chaos/targets/vllm_driver.py in vLLM's own venv.

    observer ──Launch(argv, env)──► .venv-vllm/bin/python vllm_driver.py --out-dir --spec
                                       └─► VLLM::EngineCore ─► VLLM::Worker_TP0, Worker_TP1

vLLM's dependencies (transformers, protobuf, fastapi, numba, ...) would disturb the main
venv, so the target has its own: ``scripts/install_vllm_target.sh`` makes ``.venv-vllm``
(``FAULTLAB_VLLM_PYTHON`` points at another interpreter that has vLLM).  Every fault kind
applies: the observer signals a worker rank or the engine core, kills the driver, or damages
the engine's shared-memory broadcast queue (``/dev/shm/psm_*``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import ClassVar

from chaos.targets.base import FAULT_KINDS, Launch, Target, WorkloadSpec
from chaos.targets.vllm_driver import DEFAULT_ENV

ROOT = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).resolve().with_name("vllm_driver.py")
INSTALL = "scripts/install_vllm_target.sh"
# Settings the driver needs (its own defaults, one list); the caller's own values win.
# VLLM_CPU_OMP_THREADS_BIND, unless set, is computed by the driver (one CPU group per rank).
DRIVER_ENV = {**DEFAULT_ENV, "PYTHONUNBUFFERED": "1"}
# The main venv's settings must not leak into vLLM's interpreter.
DROPPED_ENV = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
_HAS_VLLM = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"


def vllm_python() -> Path:
    """The interpreter that runs the driver: $FAULTLAB_VLLM_PYTHON or .venv-vllm's."""
    override = os.environ.get("FAULTLAB_VLLM_PYTHON")
    return Path(override) if override else ROOT / ".venv-vllm" / "bin" / "python"


class VllmTarget(Target):
    name: ClassVar[str] = "vllm"
    extra: ClassVar[str] = INSTALL
    applies: ClassVar[frozenset[str]] = frozenset(FAULT_KINDS)
    # The gloo rendezvous file (left when a process of the tree is killed) and the CPU
    # all-reduce segments named after it (left even by vLLM's own shutdown: it SIGKILLs
    # workers that do not exit within its grace).
    temp_globs: ClassVar[tuple[str, ...]] = ("/tmp/vllm_dist_*", "/dev/shm/vllm_dist_*")
    # Importing vLLM takes 10-30 s and an engine start 30-110 s on two shared cores.
    start_timeout_s: ClassVar[float] = 300.0
    # vLLM's own shutdown after ``done`` (and ``linger_s``) takes 5-10 s on a quiet machine and
    # over 15 s on a loaded one: the engine core waits VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS (5)
    # for workers that do not exit, SIGTERMs them, then everything is SIGKILLed.
    shutdown_timeout_s: ClassVar[float] = 30.0
    # vLLM's OTLP tracing (llm_request spans), turned on by the driver when the observer
    # sets OTEL_EXPORTER_OTLP_TRACES_ENDPOINT.
    otlp_traces: ClassVar[bool] = True

    def unavailable(self) -> str | None:
        python = vllm_python()
        if not python.exists():
            return f"no vLLM interpreter at {python}; install it with {INSTALL}"
        try:
            found = subprocess.run([str(python), "-c", _HAS_VLLM], timeout=60,
                                   capture_output=True).returncode == 0
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"{python} does not run ({exc}); reinstall with {INSTALL}"
        return None if found else f"{python} cannot import vllm; install it with {INSTALL}"

    def launch(self, spec: WorkloadSpec, out_dir: str) -> Launch:
        argv = [str(vllm_python()), "-u", str(DRIVER), "--out-dir", out_dir,
                "--spec", json.dumps(spec.to_json(), sort_keys=True)]
        env = {k: v for k, v in os.environ.items() if k not in DROPPED_ENV}
        return Launch(argv=argv, env={**DRIVER_ENV, **env})


TARGET = VllmTarget()

if __name__ == "__main__":  # a quick look: python -m chaos.targets.vllm_target
    print(TARGET.unavailable() or f"vllm target ready: {vllm_python()}", file=sys.stderr)
