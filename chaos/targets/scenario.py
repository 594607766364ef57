"""A target scenario: one fault, applied from outside, to any target's driver and workers.

    [[target_scenario]]            in a suite file (chaos/suites/targets.toml)
      name                         unique in the suite
      fault                        none | kill | term | stop | kill_driver | damage_shm
      role, rank                   whom kill/term/stop hit (default: worker rank 1)
      after_invoke = k             the fault's clock starts at the k-th ``invoke`` event
                                   (1-based); without it, at ``ready``
      at = [low, high]             seconds after that, drawn from the seed (or one number)
      busy = false                 kill_driver with the workers idle: after ``done``, while
                                   the driver lingers (the spec's ``linger_s`` is set for it)
      bound_s                      every call must end within it; ``stop`` sends SIGCONT
                                   after it; the driver must exit within it after ``done``
      detect_s, exit_s             the caller must see a worker's death within detect_s;
                                   every process must be gone exit_s after the driver ended
      damage_bytes                 damage_shm: how many bytes to overwrite (seeded noise)
      tolerate = ["hang"]          invariants whose violations are expected of this
                                   scenario: kept as notes, not failures
      [target_scenario.spec]       WorkloadSpec overrides (calls, call_s, ranks, tokens)

Invariant: the fault's time is a pure function of (scenario name, seed), never of the
target, so every target meets the same fault at the same moment of its workload.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

from chaos.targets.base import FAULT_KINDS, WorkloadSpec

_KEYS = {"name", "fault", "role", "rank", "after_invoke", "at", "busy", "bound_s", "detect_s",
         "exit_s", "damage_bytes", "tolerate", "spec", "description"}
_SPEC_KEYS = {f.name for f in dataclasses.fields(WorkloadSpec)} - {"seed"}
INVARIANTS = ("hang", "detection", "orphan", "leak", "results", "fault_free", "start", "unfired")


class TargetScenarioError(ValueError):
    """A [[target_scenario]] table is malformed; the message names the key."""


@dataclasses.dataclass(frozen=True)
class TargetScenario:
    name: str
    fault: str = "none"
    role: str = "worker"
    rank: int | None = 1
    after_invoke: int | None = None
    at: tuple[float, float] = (0.0, 0.0)
    busy: bool = True
    bound_s: float = 5.0
    detect_s: float = 5.0
    exit_s: float = 5.0
    damage_bytes: int = 65536
    tolerate: tuple[str, ...] = ()
    spec: dict[str, Any] = dataclasses.field(default_factory=dict)
    description: str = ""

    def fault_delay_s(self, seed: int) -> float:
        """Seconds from the trigger to the fault: the same for every target."""
        low, high = self.at
        return random.Random(f"{self.name}:{seed}").uniform(low, high)

    def rng(self, seed: int) -> random.Random:
        """Every other random choice of the run (which segment, which bytes)."""
        return random.Random(f"{self.name}:{seed}:choices")

    def workload_spec(self, seed: int) -> WorkloadSpec:
        fields = {**self.spec, "seed": seed}
        if self.fault == "kill_driver" and not self.busy:
            fields["linger_s"] = max(float(fields.get("linger_s", 0.0)), self.at[1] + 2.0)
        return WorkloadSpec(**fields)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["at"] = list(self.at)
        data["tolerate"] = list(self.tolerate)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str,
                  spec_defaults: dict[str, Any] | None = None) -> TargetScenario:
        unknown = sorted(set(data) - _KEYS)
        if unknown:
            raise TargetScenarioError(f"{where}.{unknown[0]}: unknown key; known: {sorted(_KEYS)}")
        name = data.get("name")
        if not isinstance(name, str) or not name:
            raise TargetScenarioError(f"{where}.name: every scenario needs a name")
        fault = data.get("fault", "none")
        if fault not in FAULT_KINDS:
            raise TargetScenarioError(f"{where}.fault: must be one of {list(FAULT_KINDS)}, "
                                      f"got {fault!r}")
        return cls(
            name=name, fault=fault, role=_str(data, "role", "worker", where),
            rank=_rank(data.get("rank", 1), where), after_invoke=_after(data, where),
            at=_at(data.get("at", 0.0), where), busy=_bool(data, "busy", True, where),
            bound_s=_seconds(data, "bound_s", 5.0, where),
            detect_s=_seconds(data, "detect_s", 5.0, where),
            exit_s=_seconds(data, "exit_s", 5.0, where),
            damage_bytes=_positive_int(data, "damage_bytes", 65536, where),
            tolerate=_tolerate(data.get("tolerate", []), where),
            spec=_spec({**(spec_defaults or {}), **data.get("spec", {})}, f"{where}.spec"),
            description=_str(data, "description", "", where),
        )


def _str(data: dict[str, Any], key: str, default: str, where: str) -> str:
    value = data.get(key, default)
    if not isinstance(value, str):
        raise TargetScenarioError(f"{where}.{key}: must be a string, got {value!r}")
    return value


def _bool(data: dict[str, Any], key: str, default: bool, where: str) -> bool:
    value = data.get(key, default)
    if not isinstance(value, bool):
        raise TargetScenarioError(f"{where}.{key}: must be true or false, got {value!r}")
    return value


def _rank(value: Any, where: str) -> int | None:
    if value is None or value == "none":
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise TargetScenarioError(f"{where}.rank: must be an integer >= 0, got {value!r}")
    return value


def _after(data: dict[str, Any], where: str) -> int | None:
    value = data.get("after_invoke")
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise TargetScenarioError(f"{where}.after_invoke: must be an integer >= 1 (the k-th "
                                  f"invoke), got {value!r}")
    return value


def _at(value: Any, where: str) -> tuple[float, float]:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = [value, value]
    ok = (isinstance(value, list) and len(value) == 2
          and all(isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in value)
          and value[0] <= value[1])
    if not ok:
        raise TargetScenarioError(f"{where}.at: seconds >= 0, or [low, high] with low <= high, "
                                  f"got {value!r}")
    return float(value[0]), float(value[1])


def _seconds(data: dict[str, Any], key: str, default: float, where: str) -> float:
    value = data.get(key, default)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
        raise TargetScenarioError(f"{where}.{key}: must be seconds > 0, got {value!r}")
    return float(value)


def _positive_int(data: dict[str, Any], key: str, default: int, where: str) -> int:
    value = data.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise TargetScenarioError(f"{where}.{key}: must be an integer >= 1, got {value!r}")
    return value


def _tolerate(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(v in INVARIANTS for v in value):
        raise TargetScenarioError(f"{where}.tolerate: a list of {list(INVARIANTS)}, got {value!r}")
    return tuple(value)


def _spec(data: Any, where: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise TargetScenarioError(f"{where}: must be a table")
    unknown = sorted(set(data) - _SPEC_KEYS)
    if unknown:
        raise TargetScenarioError(f"{where}.{unknown[0]}: unknown key; known: {sorted(_SPEC_KEYS)}")
    for key, value in data.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
            raise TargetScenarioError(f"{where}.{key}: must be a number >= 0, got {value!r}")
    if data.get("ranks", 1) < 1 or data.get("calls", 1) < 1:
        raise TargetScenarioError(f"{where}: calls and ranks must be >= 1")
    return dict(data)
