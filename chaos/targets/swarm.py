"""The target swarm: one seed draws one outside fault and the workload it lands in, for any
chaos target (chaos.swarm is faultlab's own, with its failpoints; a peer has none).

    seed ──random.Random("faultlab-target-swarm:SEED")──► TargetScenario "tswarm-SEED"
        fault     a kind of FAULT_KINDS, by KIND_WEIGHTS (kill and the driver's kill most)
        whom      kill/term/stop: a role of ``roles`` (the target's: vLLM adds engine_core)
                  and, for a worker, a rank below the spec's ranks
        when      busy faults: the clock starts at the k-th invoke (1 <= k <= calls), or at
                  ready; then a delay drawn here, written as a point (at = [d, d]), so the
                  moment never depends on the scenario's name (shrinking and filing rename
                  nothing of it); kill_driver idle: d after ``done`` (the driver lingers)
        spec      calls 2..MAX_CALLS, call_s of CALL_S, ranks of RANKS
        stop      tolerates "hang": no target puts a deadline on its calls, a stopped worker
                  hangs every one of them (SIGCONT after bound_s lets the calls end)
    TargetScenario ──scenario_toml──► a [[target_scenario]] table (OUT/regressions.toml);
    chaos.suites.load_suite reads it back equal (``from_dict``).

Invariants: ``draw`` is a pure function of (seed, roles); every drawn scenario is valid for
``TargetScenario.from_dict`` (after_invoke <= calls, rank < ranks).
"""

from __future__ import annotations

import json
import random
from typing import Any

from chaos.targets.base import FAULT_KINDS
from chaos.targets.scenario import TargetScenario

KIND_WEIGHTS = {"none": 1, "kill": 3, "term": 2, "stop": 1, "kill_driver": 3, "damage_shm": 2}
assert set(KIND_WEIGHTS) == set(FAULT_KINDS)
MAX_CALLS = 8
CALL_S = (0.05, 0.1, 0.2)
RANKS = (1, 2, 2, 3)
DAMAGE_BYTES = (64, 4096, 65536)
BOUND_S = 10.0  # a call's bound: a respawn on a loaded 2-core machine stays well inside it
STOP_BOUND_S = 2.0
ROLES = ("worker",)
ROLES_BY_TARGET = {"vllm": ("worker", "engine_core")}


def roles_of(target: str) -> tuple[str, ...]:
    """The roles a target's ready event names that a signal may hit."""
    return ROLES_BY_TARGET.get(target, ROLES)


def draw(seed: int, roles: tuple[str, ...] = ROLES) -> TargetScenario:
    """The target scenario of ``seed`` (the same seed and roles, the same scenario)."""
    rng = random.Random(f"faultlab-target-swarm:{seed}")
    kinds = list(KIND_WEIGHTS)
    fault = rng.choices(kinds, weights=[KIND_WEIGHTS[k] for k in kinds])[0]
    calls, call_s, ranks = rng.randint(2, MAX_CALLS), rng.choice(CALL_S), rng.choice(RANKS)
    role = rng.choice(roles)
    rank: int | None = rng.randrange(ranks) if role == "worker" else None
    busy = rng.random() < 0.6
    after: int | None = rng.randint(1, calls) if rng.random() < 0.8 else None
    delay = round(rng.uniform(0.0, 0.6 * call_s), 3)  # inside the call it follows
    damage = rng.choice(DAMAGE_BYTES)
    data: dict[str, Any] = {"name": f"tswarm-{seed}", "fault": fault,
                            "spec": {"calls": calls, "call_s": call_s, "ranks": ranks},
                            "bound_s": BOUND_S}
    if fault in ("kill", "term", "stop"):
        data.update(role=role, rank="none" if rank is None else rank)
    if fault == "stop":
        data.update(bound_s=STOP_BOUND_S, tolerate=["hang"])
    if fault == "damage_shm":
        data["damage_bytes"] = damage
    if fault == "kill_driver" and not busy:
        data.update(busy=False, at=round(rng.uniform(0.05, 0.3), 3))
    elif fault != "none":
        data["at"] = delay
        if after is not None:
            data["after_invoke"] = after
    return TargetScenario.from_dict(data, f"tswarm-{seed}")


def scenario_toml(scenario: TargetScenario) -> str:
    """One [[target_scenario]] table; the defaults left out, so it reads back equal."""
    data = scenario.to_dict()
    default = TargetScenario(name=scenario.name).to_dict()
    lines = ["[[target_scenario]]"]
    for key, value in data.items():
        if key == "spec" or (value == default[key] and key != "name"):
            continue
        if key == "rank" and value is None:
            value = "none"
        if key == "after_invoke" and value is None:
            continue
        lines.append(f"{key} = {_toml(value)}")
    if data["spec"]:
        lines += ["[target_scenario.spec]"] + [f"{k} = {_toml(v)}" for k, v in data["spec"].items()]
    return "\n".join(lines) + "\n"


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} ({type(value).__name__}) as a TOML value")
