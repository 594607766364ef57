"""The swarm's recovery family: a seed may draw, instead of a plain swarm scenario, model
generation under the ``restart`` policy with a fault mid-generation, and maybe a second
fault that lands while the recovery runs ("recovery itself was interrupted").

    seed ──random.Random("faultlab-swarm-recovery:SEED")──► with RECOVERY_P: RecoveryScenario
        fault   one of FIRST (kill, sigterm, hang with a 1 s step timeout, corrupt) on a drawn
                rank, after a seeded step in STEPS (chaos.recovery draws it from the seed)
        then    none, before_live or in_replay (chaos/interrupted_recovery.py) on a drawn
                rank, or skew: a kill whose restart loads a changed checkpoint
                (chaos/skewed_restart.py; sync scheduling, no second fault)
        layout  tp 2 (fork), async scheduling with ASYNC_P; REQUESTS x MAX_TOKENS tokens
        aimed   at a planted executor (``executor``) or a planted Recovery of chaos.mutants
                (``recovery``: CountsNoMismatch, KeepsRebuiltToken), which only this family
                runs (``planted``)
      else None: the seed's plain swarm (chaos.swarm.draw), which this never touches: its
      own random stream, so a plain seed draws the same swarm as before this family existed

    judge ──chaos.recovery.run_recovery──► (result, problems): every violation of the
        recovery's oracles (requests finished, the fault-free tokens, the recovery bound,
        leaks, and the second fault's: it landed; a worker killed before going live never
        serves).  No history: the history checker reads a call workload's CallRecords and
        the workers' execute spans, and a generation's calls are the engine's own steps
        (one execute_model per step, replays expected), so it does not apply here.
    candidates ──► the shrink: the second fault dropped (the first is what makes a
        recovery at all; its step and rank stay as drawn).  That is the whole shrink.

Left out: ``kill_node`` (a `faultlab worker` agent per scenario; the recovery suite runs it),
``fail_stop`` (no recovery to interrupt), pp 2 (the recovery suite covers it).
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import random
from pathlib import Path
from typing import Any

from chaos.interrupted_recovery import SECOND_FAULTS
from chaos.recovery import RecoveryResult, RecoveryScenario, run_recovery

RECOVERY_P = 0.1  # a seed draws this family with this probability
FIRST = ("kill", "kill", "sigterm", "hang", "corrupt")
THEN = ("", "before_live", "before_live", "in_replay", "skew")  # skew: not a second fault
ASYNC_P = 0.3
STEPS = (2, 6)
REQUESTS, MAX_TOKENS = 3, 12
STEP_TIMEOUT_S = 5.0  # a step that waits on a dead worker of a bad restart fails by then
RECOVERY_BOUND_S = 20.0  # two start-ups of a model worker on a loaded 2-core machine
WORLD_SIZE = 2
SITES = tuple(f"recovery:{f}" for f in dict.fromkeys(FIRST)) + tuple(
    f"recovery:then={w}" for w in SECOND_FAULTS) + ("recovery:skew",)


def draw(seed: int, mutant: str = "") -> RecoveryScenario | None:
    """The recovery scenario of ``seed``, or None for a plain swarm seed (deterministic);
    ``mutant`` ("module:Class", a planted executor or Recovery) runs in it."""
    rng = random.Random(f"faultlab-swarm-recovery:{seed}")
    if rng.random() >= RECOVERY_P:
        return None
    fault, rank = rng.choice(FIRST), rng.randrange(WORLD_SIZE)
    then, then_rank = rng.choice(THEN), rng.randrange(WORLD_SIZE)
    sync = rng.random() >= ASYNC_P
    skew = then == "skew"
    fault, then, sync = ("kill", "", True) if skew else (fault, then, sync)
    return RecoveryScenario(
        f"recovery-{seed}", fault=fault, rank=rank, steps=STEPS, tp=WORLD_SIZE,
        async_scheduling=not sync, requests=REQUESTS, max_tokens=MAX_TOKENS,
        step_timeout=1.0 if fault == "hang" else STEP_TIMEOUT_S,
        recovery_bound_s=RECOVERY_BOUND_S, then=then, then_rank=then_rank, skew=skew,
        executor="" if planted(mutant) else mutant, recovery=mutant if planted(mutant) else "")


def planted(mutant: str) -> bool:
    """``mutant`` names a planted Recovery (not an executor): only this family can run it."""
    from executor.model.recovery import Recovery

    if not mutant:
        return False
    module, _, attr = mutant.partition(":")
    cls = getattr(importlib.import_module(module), attr, None)
    return isinstance(cls, type) and issubclass(cls, Recovery)


def judge(scenario: RecoveryScenario, seed: int, where: Path) -> tuple[RecoveryResult, list[str]]:
    """Run ``scenario`` into ``where``; its result and every problem ("[invariant] message")."""
    result = run_recovery(scenario, seed, where)
    return result, [str(v) for v in result.violations]


def candidates(scenario: RecoveryScenario) -> list[RecoveryScenario]:
    """Smaller schedules to try: without the second fault (module docstring)."""
    return [dataclasses.replace(scenario, then="", then_rank=0)] if scenario.then else []


def schedule_length(scenario: RecoveryScenario) -> int:
    """Faults in the schedule (a generation has no calls of its own to count)."""
    return 1 + bool(scenario.then)


def describe(scenario: RecoveryScenario) -> str:
    """"kill rank 1, then before_live rank 0", for a finding's line."""
    then = f", then {scenario.then} rank {scenario.then_rank}" if scenario.then else ""
    skew = ", the restart loads a changed checkpoint" if scenario.skew else ""
    return f"a generation: {scenario.fault} rank {scenario.rank}{then}{skew}"


def sites_hit(result: RecoveryResult, scenario: RecoveryScenario) -> list[str]:
    """The coverage sites of the faults that fired in ``result`` (a skew counts as one)."""
    if scenario.skew:
        return ["recovery:skew" for _ in result.faults]
    return [f"recovery:then={r['then']}" if r.get("second") else f"recovery:{r['kind']}"
            for r in result.faults]


def interrupted(result: RecoveryResult) -> bool:
    """The second fault landed while the recovery ran."""
    return any(r.get("second") for r in result.faults)


def load_saved(source: Path) -> tuple[int, RecoveryScenario] | None:
    """The seed and recovery scenario a run saved in ``source``/scenario.json (None when it
    holds a plain scenario)."""
    saved: dict[str, Any] = json.loads((source / "scenario.json").read_text())
    if "recovery" not in saved:
        return None
    if not isinstance(saved.get("seed"), int):
        raise ValueError(f"seed must be an integer, got {saved.get('seed')!r}")
    return saved["seed"], RecoveryScenario.from_dict(saved["recovery"], "recovery")


def fired_signature(result_json: Path) -> list[tuple[Any, ...]]:
    """What fired, comparable across a run and its replay: (kind, rank, step or phase)."""
    try:
        faults = json.loads(result_json.read_text())["faults"]
    except (FileNotFoundError, KeyError, ValueError):
        return []
    return [(f.get("kind"), f.get("rank"), f.get("step", f.get("during"))) for f in faults]
