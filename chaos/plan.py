"""``FaultPlan``: faults plus the one seed that every random choice is drawn from.

    FaultPlan(faults, seed) ──resolve()──► [ResolvedFault(index, fault, at_s, calls)]
                                             at_s:  a concrete time (ranges drawn)
                                             calls: the call numbers of ``method`` that trigger it

All randomness happens here, before the run, from ``random.Random(f"{seed}:{index}")``:
the run itself only counts calls and watches the clock, so a seed and a plan replay the
same fault timeline.  ``chaos.strategies`` registers ``plan_random`` with Hypothesis.
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Iterable, Sequence
from typing import Any

from chaos.faults import Fault, PlanError, fault_from_dict

DEFAULT_HORIZON = 2000  # probability triggers are drawn for this many calls


def plan_random(seed: int, index: int) -> random.Random:
    """The random source of fault ``index`` under ``seed`` (string seeding is stable)."""
    return random.Random(f"faultlab-chaos:{seed}:{index}")


@dataclasses.dataclass(frozen=True)
class ResolvedFault:
    """One fault with every random choice made."""

    index: int
    fault: Fault
    at_s: float | None  # seconds after the workload starts, or None (call-triggered)
    method: str  # the method whose calls are counted ("*": every call)
    calls: frozenset[int]  # call numbers (1-based, per ``method``) that trigger the fault

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "fault": self.fault.to_dict(), "at_s": self.at_s,
                "method": self.method, "calls": sorted(self.calls)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ResolvedFault:
        return cls(data["index"], fault_from_dict(data["fault"]), data["at_s"],
                   data["method"], frozenset(data["calls"]))


@dataclasses.dataclass(frozen=True)
class FaultPlan:
    faults: Sequence[Fault] = ()
    seed: int = 0
    horizon: int = DEFAULT_HORIZON

    def __post_init__(self) -> None:
        object.__setattr__(self, "faults", tuple(self.faults))
        for i, fault in enumerate(self.faults):
            if not isinstance(fault, Fault):
                raise PlanError(f"faults[{i}]: expected a Fault, got {type(fault).__name__}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise PlanError(f"seed must be an integer, got {self.seed!r}")

    def with_seed(self, seed: int) -> FaultPlan:
        return dataclasses.replace(self, seed=seed)

    def check_world(self, world_size: int) -> None:
        """Raise ``PlanError`` unless every fault's rank is in ``0 .. world_size - 1``."""
        check_ranks(self.faults, world_size)

    def resolve(self) -> list[ResolvedFault]:
        return [_resolve(i, f, plan_random(self.seed, i), self.horizon)
                for i, f in enumerate(self.faults)]

    @property
    def kills_driver(self) -> bool:
        return any(f.kind == "kill_driver" for f in self.faults)

    def to_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "horizon": self.horizon,
                "faults": [f.to_dict() for f in self.faults]}

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "plan") -> FaultPlan:
        faults = [fault_from_dict(f, f"{where}.faults[{i}]")
                  for i, f in enumerate(data.get("faults", []))]
        return cls(faults, seed=int(data.get("seed", 0)),
                   horizon=int(data.get("horizon", DEFAULT_HORIZON)))

    def dumps(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)


def check_ranks(faults: Sequence[Fault], world_size: int) -> None:
    """Every fault's rank must be a rank of the executor; the error names the fault."""
    for i, fault in enumerate(faults):
        if fault.rank >= world_size:
            raise PlanError(f"faults[{i}].rank: {fault.kind} targets rank {fault.rank}, outside "
                            f"the world of {world_size} rank(s); valid ranks are 0..{world_size - 1}")


def _resolve(index: int, fault: Fault, rng: random.Random, horizon: int) -> ResolvedFault:
    if fault.on_call is not None:
        method, k = fault.on_call
        return ResolvedFault(index, fault, None, method, frozenset({k}))
    if fault.probability is not None:
        p = fault.probability
        calls = frozenset(n for n in range(1, horizon + 1) if rng.random() < p)
        return ResolvedFault(index, fault, None, fault.calls_of, calls)
    at = fault.at
    at_s = rng.uniform(*at) if isinstance(at, tuple) and len(at) == 2 else float(
        at[0] if isinstance(at, tuple) else at or 0.0)
    return ResolvedFault(index, fault, at_s, "*", frozenset())


def schedule_signature(resolved: Iterable[ResolvedFault]) -> list[tuple[Any, ...]]:
    """What must be equal when the same seed and plan are resolved twice."""
    return [(r.index, r.fault.kind, r.fault.rank, r.at_s, r.method, tuple(sorted(r.calls)))
            for r in resolved]


def timeline_signature(faults: list[dict[str, object]]) -> list[tuple[object, ...]]:
    """What a replay must reproduce of a run's fault timeline: which fault hit which rank
    on which call (the records of ``ctl/faults-*.jsonl``)."""
    return sorted({(f["index"], f["kind"], f["rank"], f.get("method"), f.get("call"))
                   for f in faults}, key=repr)
