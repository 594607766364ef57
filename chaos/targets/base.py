"""What a chaos target provides, and the registry of targets by name.

    Target (one small module per executor: faultlab, vllm, processpool, loky, pebble, ray)
      name, extra               the pip extra (or install recipe) that brings it
      unavailable()             None, or one line saying what is missing and how to install it
      applies                   the fault kinds that apply to it (FAULT_KINDS)
      launch(spec, out_dir)     the driver subprocess to start: argv, env, cwd
      temp_globs                temp files it is known to leave (checked as leftovers)
      start_timeout_s           how long its start-up may take (vLLM: minutes)
      shutdown_timeout_s        how long its driver may take to exit after ``done``
      expected_values(spec)     each call's fault-free value, when the spec alone gives it
      otlp_traces               it exports OpenTelemetry spans itself: the observer points
                                it (OTEL_EXPORTER_OTLP_TRACES_*) at a loopback receiver

The driver subprocess runs the target's executor and ``spec``'s workload and reports in the
driver protocol (chaos/targets/protocol.py).  Faults are applied from outside by the
observer (chaos/targets/run.py), never by the target: a target needs no help from us.

Invariants:
- ``get_target`` of an unknown name raises ``ValueError`` naming the known ones; of a
  target whose packages are missing, ``TargetUnavailable`` (one line, naming the extra).
- A workload is a pure function of its spec: the same spec gives the same values on every
  target that runs it without a fault (the fault-free reference).
"""

from __future__ import annotations

import abc
import dataclasses
import importlib
from typing import Any, ClassVar

# kill/term/stop a worker rank (SIGKILL, SIGTERM, SIGSTOP then SIGCONT after the bound),
# kill the driver (workers idle or busy), damage the target's shared-memory segments.
FAULT_KINDS = ("none", "kill", "term", "stop", "kill_driver", "damage_shm")
TARGET_NAMES = ("faultlab", "vllm", "processpool", "loky", "pebble", "ray")
_MODULES = {name: f"chaos.targets.{name}_target" for name in TARGET_NAMES}


class TargetUnavailable(RuntimeError):
    """The target's packages are not installed; the message says how to install them."""


@dataclasses.dataclass(frozen=True)
class WorkloadSpec:
    """What the driver runs: ``calls`` calls, each a unit of work of about ``call_s`` on each
    of ``ranks`` workers (for vLLM: ``calls`` requests of ``tokens`` tokens each)."""

    calls: int = 16
    call_s: float = 0.2
    ranks: int = 2
    tokens: int = 64
    seed: int = 0
    # After ``done`` the driver sleeps this long before it shuts its executor down and exits:
    # the window in which ``kill_driver`` hits a driver whose workers are idle.
    linger_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Launch:
    argv: list[str]
    env: dict[str, str]
    cwd: str | None = None


class Target(abc.ABC):
    name: ClassVar[str]
    extra: ClassVar[str]  # e.g. "targets" for `pip install -e '.[targets]'`
    applies: ClassVar[frozenset[str]]
    temp_globs: ClassVar[tuple[str, ...]] = ()
    start_timeout_s: ClassVar[float] = 60.0
    # How long its driver may take to exit after ``done`` (+ the spec's linger_s) before the
    # observer calls it a hang at shutdown.
    shutdown_timeout_s: ClassVar[float] = 15.0
    # It sends its own spans over OTLP/HTTP when OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set.
    otlp_traces: ClassVar[bool] = False

    @abc.abstractmethod
    def unavailable(self) -> str | None:
        """None when the target can run here; else one line naming what to install."""

    @abc.abstractmethod
    def launch(self, spec: WorkloadSpec, out_dir: str) -> Launch:
        """The driver subprocess that runs ``spec`` on this target."""

    def expected_values(self, spec: WorkloadSpec) -> dict[int, Any] | None:
        """Each call's fault-free value (as ``protocol.digest`` gives it), by call id, when
        it can be computed from ``spec`` alone; None (the default): the oracles compare with
        a fault-free run of the same spec instead (chaos.targets.oracles.reference_values)."""
        return None


def get_target(name: str) -> Target:
    """The target called ``name``; raises ValueError (unknown) or TargetUnavailable."""
    module_name = _MODULES.get(name)
    if module_name is None:
        raise ValueError(f"unknown target {name!r}; known: {', '.join(TARGET_NAMES)}")
    module = importlib.import_module(module_name)
    target: Target = module.TARGET
    missing = target.unavailable()
    if missing is not None:
        raise TargetUnavailable(f"target {name}: {missing}")
    return target
