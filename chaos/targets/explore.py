"""``explore --target NAME``: the target swarm's scenarios against one chaos target until a
budget ends; each new failure shrunk, reproduced k of n and filed as a finding about THAT
target (chaos.explore is faultlab's own, with its failpoints and mutants).

    seed, seed+1, ... ──chaos.targets.swarm.draw──► TargetScenario "tswarm-SEED"
        │                                            │ judge: TargetRun + chaos.targets.oracles
        │                                            │   (minus "unfired": a fault that came
        │                                            │   too late tested nothing, it is counted)
        │                                            │ + chaos.history_check on the run's
        │                                            │   history (chaos.targets.history)
        │                    coverage: kind x whom/when x outcome ◄──┤
        │                                            ▼ a failure
        │     does it break an invariant no finding broke yet? no: counted to the first
        │       shrink: the fault on an earlier call, fewer calls, fewer ranks, no delay,
        │       while the run still breaks one of the new invariants
        │       reproduce k of n (a rerun breaking one of the finding's own invariants);
        │       k = 0: flaky (OUT/flaky.toml, kept, never dropped, not a failure)
        │       OUT/regressions.toml ◄── the shrunk [[target_scenario]]
        └──────── until the budget ends ──► coverage.md/json, junit.xml, explore.json

    OUT/scenarios/tswarm-SEED/  each run: target_scenario.json (what replay takes),
                                record.json, result.json, history.jsonl, driver.log
    OUT/findings/SLUG/          run/ (the shrunk scenario), repro-K/
    OUT/reference/              fault-free values, for a target that cannot compute them

A finding on a peer is a finding about that executor (loky's workers outliving a killed
driver are loky's), never filed in chaos/suites/regressions.toml (faultlab's own).  The
scenario's name and seed are kept through shrinking and filing: the fault's moment is a
point in the scenario (chaos.targets.swarm), and the damage's bytes come from (name, seed).

The decisions (same bug, same failure while shrinking, reproduced, flaky, exit status) are
chaos.explore's, called through that module (``search.triage``, ``search.shrink``,
``search.own_invariants``, ``search.reproduces``): one rule and one test for both searches.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from chaos import explore as search
from chaos import history, history_check
from chaos.explore import FindingOf, Limits, budget_seeds, signature_of, write_junit
from chaos.targets import history as target_history
from chaos.targets import swarm
from chaos.targets.base import FAULT_KINDS, Target
from chaos.targets.compare import TargetResult, run_target_scenario, slug
from chaos.targets.oracles import reference_values
from chaos.targets.run import TargetRecord
from chaos.targets.scenario import TargetScenario

IGNORED = frozenset({"unfired"})
SAVED = "target_scenario.json"
Say = Callable[[str], None]


@dataclasses.dataclass
class TargetVerdict:
    result: TargetResult
    record: TargetRecord
    events: list[dict[str, Any]]
    problems: list[str]  # "[invariant] message" and "history.kind: message"

    @property
    def signature(self) -> frozenset[str]:
        return signature_of(self.problems)


def save(where: Path, target: str, scenario: TargetScenario, seed: int) -> None:
    where.mkdir(parents=True, exist_ok=True)
    (where / SAVED).write_text(json.dumps({"target": target, "seed": seed,
                                           "scenario": scenario.to_dict()}, indent=1))


def load_saved(where: Path) -> tuple[str, int, TargetScenario]:
    """(target, seed, scenario) of a run dir explore wrote; ValueError names what is wrong."""
    path = where / SAVED
    try:
        saved = json.loads(path.read_text())
        data = dict(saved["scenario"])
        if data.get("rank") is None:
            data["rank"] = "none"
        if data.get("after_invoke") is None:
            data.pop("after_invoke", None)
        if not isinstance(saved["seed"], int) or not isinstance(saved["target"], str):
            raise ValueError("seed must be an integer and target a name")
        return saved["target"], saved["seed"], TargetScenario.from_dict(data, str(path))
    except (KeyError, TypeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path} is not a saved target scenario: {type(exc).__name__}: {exc}") \
            from None


def judge(target: Target, scenario: TargetScenario, seed: int, where: Path,
          reference_root: Path) -> TargetVerdict:
    """Run ``scenario`` on ``target`` into ``where``; its history and every problem found."""
    save(where, target.name, scenario, seed)
    result = run_target_scenario(target, scenario, seed, where, reference_root)
    record = TargetRecord.from_json(json.loads((where / "record.json").read_text()))
    expected = (reference_values(target, scenario, seed, reference_root)
                if record.applicable and record.calls else None)
    events = target_history.build(record, expected)
    history.write(where / history.FILE_NAME, events)
    problems = [v for v in result.violations if _invariant(v) not in IGNORED]
    problems += [str(v) for v in history_check.check(events)]
    return TargetVerdict(result, record, events, problems)


def _invariant(problem: str) -> str:
    return problem.split("]")[0].lstrip("[")


def schedule_length(scenario: TargetScenario) -> int:
    """Calls plus the fault (one step), the measure shrinking lowers."""
    return int(scenario.spec.get("calls", 16)) + (scenario.fault != "none")


def candidates(sc: TargetScenario) -> list[TargetScenario]:
    """Smaller or earlier versions of ``sc``, the boldest first: the fault on the first call
    (as many calls after it as before), the last call dropped, fewer ranks, no delay."""
    out = []
    spec = dict(sc.spec)
    calls, ranks = int(spec.get("calls", 16)), int(spec.get("ranks", 2))
    after = sc.after_invoke
    if after is not None and after > 1:
        out.append(dataclasses.replace(sc, after_invoke=1, spec={**spec, "calls": calls - after + 1}))
    if calls > max(after or 1, 1):
        out.append(dataclasses.replace(sc, spec={**spec, "calls": calls - 1}))
    fewest = (sc.rank + 1) if sc.fault in ("kill", "term", "stop") and sc.rank is not None else 1
    if ranks > fewest:
        out.append(dataclasses.replace(sc, spec={**spec, "ranks": fewest}))
    if sc.at != (0.0, 0.0) and sc.busy and sc.fault != "none":
        out.append(dataclasses.replace(sc, at=(0.0, 0.0)))
    return out


def whom(sc: TargetScenario) -> str:
    """The coverage column: whom the fault hit and when its clock started."""
    if sc.fault == "none":
        return "-"
    if sc.fault == "kill_driver":
        return "driver, workers " + ("busy" if sc.busy else "idle")
    start = "from ready" if sc.after_invoke is None else "mid-work"
    who = "shm" if sc.fault == "damage_shm" else (
        sc.role if sc.rank is None else f"{sc.role} rank {sc.rank}")
    return f"{who}, {start}"


@dataclasses.dataclass
class TargetFinding(FindingOf[TargetScenario]):
    target: str = ""  # the target it is about

    @property
    def name(self) -> str:
        return f"{self.target}: " + "+".join(sorted(self.signature))

    def schedule_length(self, scenario: TargetScenario) -> int:
        return schedule_length(scenario)

    def to_dict(self) -> dict[str, Any]:
        return {"about": self.target, **super().to_dict()}


@dataclasses.dataclass
class TargetExploration:
    target: Target
    out: Path
    seed: int = 0
    limits: Limits = dataclasses.field(default_factory=Limits)
    say: Say = print
    max_findings: int | None = None
    regressions: Path | None = None  # where findings are filed (None: OUT/regressions.toml)
    cells: Counter[tuple[str, str, str]] = dataclasses.field(default_factory=Counter)
    findings: list[TargetFinding] = dataclasses.field(default_factory=list)
    runs: int = 0

    def run(self, budget_s: float) -> list[TargetFinding]:
        t0 = time.monotonic()
        return self.run_seeds(budget_seeds(t0, budget_s, self.seed, self.max_findings,
                                           self.findings), t0)

    def run_seeds(self, seeds: Iterable[int], t0: float | None = None) -> list[TargetFinding]:
        """Explore exactly ``seeds`` (run() draws them until its budget ends; a test names
        them); then write the reports."""
        t0 = time.monotonic() if t0 is None else t0
        for seed in seeds:
            self._explore_one(seed, t0)
        self._write_reports(time.monotonic() - t0)
        return self.findings

    def _judge(self, scenario: TargetScenario, seed: int, where: Path) -> TargetVerdict:
        return judge(self.target, scenario, seed, where, self.out)

    def _explore_one(self, seed: int, t0: float) -> None:
        scenario = swarm.draw(seed, swarm.roles_of(self.target.name))
        verdict = self._judge(scenario, seed, self.out / "scenarios" / f"tswarm-{seed}")
        self.runs += 1
        unfired = any(_invariant(v) == "unfired" for v in verdict.result.violations)
        self.cells[(scenario.fault, whom(scenario),
                    "unfired" if unfired else verdict.result.outcome)] += 1
        if not verdict.problems:
            return
        # New = invariants no finding has broken yet: a target's common leak must not hide
        # its orphans (Ray leaves both); shrinking and reproducing keep to the new ones.
        new = search.triage(self.findings, verdict.signature)
        if not new:
            return
        found_after = time.monotonic() - t0
        self.say(f"seed {seed}: {self.target.name}: {verdict.problems[0][:200]} "
                 f"({found_after:.1f} s in); shrinking")
        shrunk, shrunk_verdict = self._shrink(scenario, seed, verdict, new)
        self.findings.append(self._file(shrunk, shrunk_verdict, seed, found_after, scenario, new))

    def _shrink(self, scenario: TargetScenario, seed: int, verdict: TargetVerdict,
                wanted: frozenset[str]) -> tuple[TargetScenario, TargetVerdict]:
        found = search.shrink(
            scenario, verdict, wanted, candidates,
            lambda c, k: self._judge(c, seed, self.out / "shrinking" / f"{seed}-{k}"), self.limits)
        shutil.rmtree(self.out / "shrinking", ignore_errors=True)
        return found

    def _file(self, scenario: TargetScenario, verdict: TargetVerdict, seed: int,
              found_after: float, original: TargetScenario, new: frozenset[str]) -> TargetFinding:
        label = slug(f"{self.target.name}-" + "+".join(sorted(verdict.signature)))
        home = self.out / "findings" / f"{label}-{seed}"
        own = search.own_invariants(verdict.signature, new)
        finding = TargetFinding(verdict.signature, seed, found_after, original, scenario,
                                verdict.problems, home / "run", own=own, target=self.target.name)
        self._judge(scenario, seed, finding.run_dir)  # the run that replay takes
        for k in range(self.limits.reproductions):
            again = self._judge(scenario, seed, home / f"repro-{k + 1}")
            finding.tries += 1
            finding.reproduced += search.reproduces(again.signature, own)
        note = (f"finding about {self.target.name} (seed {seed}; rerun with --seed {seed}): "
                f"{finding.name}: {verdict.problems[0][:300]}")
        path = (self.out / "flaky.toml" if finding.flaky else
                self.regressions or self.out / "regressions.toml")
        append(path, self.target.name, seed, scenario, ("FLAKY " if finding.flaky else "") + note)
        self.say(self._announce(finding))
        return finding

    def _announce(self, f: TargetFinding) -> str:
        state = "FLAKY (did not reproduce)" if f.flaky else "reproduced"
        return (f"FOUND {f.name} at seed {f.seed} after {f.found_after_s:.1f} s (a finding "
                f"about {f.target}): {f.problems[0][:300]}\n  shrunk from "
                f"{schedule_length(f.original)} to {schedule_length(f.shrunk)} steps "
                f"({f.shrunk.fault} {whom(f.shrunk)}, {f.shrunk.spec.get('calls')} call(s)); "
                f"{state} {f.reproduced} of {f.tries}\n"
                f"  Reproduce with: {reproduce_command(f)}")

    def _write_reports(self, wall_s: float) -> None:
        coverage = coverage_dict(self.target.name, self.cells)
        (self.out / "coverage.json").write_text(json.dumps(coverage, indent=1))
        (self.out / "coverage.md").write_text(coverage_table(self.target.name, self.cells))
        (self.out / "explore.json").write_text(json.dumps({
            "target": self.target.name, "first_seed": self.seed, "runs": self.runs,
            "wall_s": round(wall_s, 1), "findings": [f.to_dict() for f in self.findings]},
            indent=1, default=str))
        write_junit(self.findings, self.runs, self.out / "junit.xml", wall_s,
                    classname=f"chaos.explore.{self.target.name}")


def new_invariants(signature: frozenset[str], known: list[frozenset[str]]) -> frozenset[str]:
    """What of ``signature`` no earlier finding has: empty, the run is a duplicate
    (chaos.explore's rule, the one both searches use)."""
    return search.new_invariants(signature, known)


def reproduce_command(f: TargetFinding) -> str:
    return f"faultlab chaos replay {f.run_dir}"


def append(path: Path, target: str, seed: int, scenario: TargetScenario, note: str) -> bool:
    """Add ``scenario`` to the target suite at ``path`` (made if missing); False if its name
    is there already.  Its [suite] seed is the first finding's: rerun others with --seed."""
    from chaos.suites import load_suite

    if path.exists() and scenario.name in {s.name for s in load_suite(str(path)).target_scenarios}:
        return False
    header = (f"# Findings of `faultlab chaos explore --target {target}` about {target}, shrunk;\n"
              f"# rerun with `faultlab chaos run {path} --target {target} --seed SEED -k NAME`.\n"
              f'[suite]\nname = "explore-{target}"\nseed = {seed}\n')
    text = path.read_text() if path.exists() else header
    path.parent.mkdir(parents=True, exist_ok=True)
    comments = "".join(f"# {line}\n" for line in note.splitlines())
    path.write_text(text + "\n" + comments + swarm.scenario_toml(scenario))
    return True


def coverage_dict(target: str, cells: Counter[tuple[str, str, str]]) -> dict[str, Any]:
    reached = {kind for kind, _, outcome in cells if outcome not in ("not_applicable", "unfired")}
    return {"target": target,
            "cells": [{"fault": k, "whom": w, "outcome": o, "runs": n}
                      for (k, w, o), n in sorted(cells.items())],
            "kinds_never_reached": [k for k in FAULT_KINDS if k not in reached]}


def coverage_table(target: str, cells: Counter[tuple[str, str, str]]) -> str:
    lines = [f"# explore --target {target}: fault kind x whom/when x outcome", "",
             "| fault | whom, when | outcome | runs |", "|---|---|---|---|"]
    lines += [f"| {k} | {w} | {o} | {n} |" for (k, w, o), n in sorted(cells.items())]
    never = coverage_dict(target, cells)["kinds_never_reached"]
    lines += ["", "Fault kinds never reached (not drawn, not applicable to the target, or "
                  "fired too late to test anything): " + (", ".join(never) or "(every kind reached)")]
    return "\n".join(lines) + "\n"


def replay(source: Path, out: Path, target: Target | None = None) -> tuple[TargetVerdict, bool]:
    """Rerun the saved target scenario of ``source`` into ``out``; (its verdict, whether it
    broke the same invariants as the run in ``source``)."""
    from chaos.targets import get_target

    name, seed, scenario = load_saved(source)
    target = target or get_target(name)
    verdict = judge(target, scenario, seed, out, out)
    before = _problems_of(source)
    return verdict, signature_of(before) == verdict.signature


def _problems_of(source: Path) -> list[str]:
    """The problems the run in ``source`` had (its result.json and history.jsonl)."""
    try:
        violations = json.loads((source / "result.json").read_text())["violations"]
        events = history.read(source / history.FILE_NAME)
    except (OSError, KeyError, ValueError):
        return []
    return [v for v in violations if _invariant(v) not in IGNORED] + [
        str(v) for v in history_check.check(events)]
