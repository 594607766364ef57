"""Target scenarios run and compared: one row per (target, scenario, seed).

    run_target_scenario(target, scenario, seed, out)  TargetRun ──► TargetRecord
                                                      ──judge_record (the oracles, the grades)──►
                                                      TargetResult (result.json, the trace)
    run_targets(suite, target, seeds, out)            every target scenario of a suite
    compare(suite, targets, seeds, out)               ──► DIR/compare.json   {"targets", "rows",
                                                                             "skipped", ...}
                                                          DIR/compare.md     scenario × target
                                                          DIR/junit-NAME.xml one per target
                                                          DIR/NAME/SCENARIO/seed-N/record.json
                                                          ... and journal-*.bin: the run's
                                                          trace (chaos.targets.run_trace)

A row: target, scenario, seed, fault (the kind), outcome (chaos.targets.oracles.outcome),
detected, detection_latency_s, cause_named (rank | worker | generic | none), orphans
[{"role", "pid"}], leftovers, violations (strings), plus tolerated, note, wall_s, dir.
A kind that does not apply to a target is a row with outcome ``not_applicable`` (a JUnit
``skipped`` case), never a missing row.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

from chaos.targets import oracles
from chaos.targets.base import Target
from chaos.targets.run import TargetRecord, TargetRun
from chaos.targets.run_trace import write_run_trace
from chaos.targets.scenario import TargetScenario

Progress = Callable[[str], None]


@dataclasses.dataclass
class TargetResult:
    target: str
    scenario: str
    seed: int
    fault: str
    outcome: str
    detected: bool
    detection_latency_s: float | None
    cause_named: str
    orphans: list[dict[str, Any]]
    leftovers: list[str]
    violations: list[str]
    tolerated: list[str]
    note: str
    wall_s: float
    dir: str

    @property
    def ok(self) -> bool:
        return not self.violations

    @property
    def name(self) -> str:
        return self.scenario

    def row(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "scenario"


def run_target_scenario(target: Target, scenario: TargetScenario, seed: int, out: Path,
                        reference_root: Path) -> TargetResult:
    observer = TargetRun(target, scenario, seed, out)
    record = observer.run()
    expected = (oracles.reference_values(target, scenario, seed, reference_root)
                if record.applicable and record.calls else None)
    result = judge_record(target.name, scenario, seed, record, expected, out)
    (out / "result.json").write_text(json.dumps(result.row(), indent=1))
    write_run_trace(record, out, observer.target_spans, result.row())  # faultlab trace export
    return result


def judge_record(target_name: str, scenario: TargetScenario, seed: int, record: TargetRecord,
                 expected: oracles.Expected, out: Path) -> TargetResult:
    """One run's row from its record alone (no process, no file): the oracles' verdicts and
    the grades, each field from one source: ``fault`` is the scenario's kind, ``detected`` /
    ``detection_latency_s`` / ``cause_named`` / ``outcome`` are chaos.targets.oracles' grades,
    ``orphans`` and ``leftovers`` are the record's, ``note`` is the record's unless a stopped
    worker's resume says what happened within the bound."""
    violations, tolerated = oracles.check(record, expected, scenario.tolerate)
    note = record.note
    if record.fault is not None and record.fault.get("within_bound"):
        note = f"within the {scenario.bound_s:g} s bound: {record.fault['within_bound']}"
    return TargetResult(
        target=target_name, scenario=scenario.name, seed=seed, fault=scenario.fault,
        outcome=oracles.outcome(record, expected), detected=oracles.detected(record),
        detection_latency_s=_rounded(oracles.detection_latency_s(record)),
        cause_named=oracles.cause_named(record),
        orphans=[{"role": o["role"], "pid": o["pid"], "rank": o.get("rank"), "status": o["status"]}
                 for o in record.orphans],
        leftovers=list(record.leftovers), violations=[str(v) for v in violations],
        tolerated=[str(v) for v in tolerated], note=note, wall_s=round(record.wall_s, 3),
        dir=str(out))


def run_targets(target: Target, scenarios: Sequence[TargetScenario], seeds: Sequence[int],
                out: Path, progress: Progress | None = None, nested: bool = False,
                reference_root: Path | None = None) -> list[TargetResult]:
    """Each scenario once per seed, into ``out/SCENARIO`` (``out/SCENARIO/seed-N`` when
    ``nested`` or more than one seed)."""
    results = []
    total, done = len(scenarios) * len(seeds), 0
    for scenario in scenarios:
        for seed in seeds:
            where = out / slug(scenario.name)
            if nested or len(seeds) > 1:
                where = where / f"seed-{seed}"
            if progress:
                progress(f"[{done + 1}/{total}] {target.name} {scenario.name} seed {seed} ... ")
            result = run_target_scenario(target, scenario, seed, where, reference_root or out)
            done += 1
            results.append(result)
            if progress:
                progress(f"{_verdict(result)} in {result.wall_s:.2f} s\n")
    return results


def compare(suite_name: str, scenarios: Sequence[TargetScenario], targets: Sequence[Target],
            seeds: Sequence[int], out: Path, skipped: Sequence[tuple[str, str]] = (),
            progress: Progress | None = None) -> list[TargetResult]:
    out.mkdir(parents=True, exist_ok=True)
    results: list[TargetResult] = []
    for target in targets:
        mine = run_targets(target, scenarios, seeds, out / target.name, progress, nested=True,
                           reference_root=out)
        write_junit(mine, suite_name, target.name, out / f"junit-{target.name}.xml")
        results += mine
    names = [t.name for t in targets]
    (out / "compare.json").write_text(json.dumps({
        "suite": suite_name, "targets": names, "seeds": list(seeds),
        "skipped": [{"target": n, "reason": r} for n, r in skipped],
        "rows": [r.row() for r in results]}, indent=1))
    (out / "compare.md").write_text(markdown(suite_name, names, [s.name for s in scenarios],
                                             list(seeds), results, skipped))
    return results


# ------------------------------------------------------------------ compare.md


def markdown(suite_name: str, targets: list[str], scenarios: list[str], seeds: list[int],
             results: list[TargetResult], skipped: Sequence[tuple[str, str]] = ()) -> str:
    by = {(r.scenario, r.target): [x for x in results if (x.scenario, x.target) == (r.scenario, r.target)]
          for r in results}
    lines = [f"# chaos compare: suite {suite_name}, seeds {seeds}", "",
             "Each cell: outcome; detection p50/p99 over the seeds; how the error names the "
             "cause; orphans; leftovers.", "",
             "| scenario | " + " | ".join(targets) + " |",
             "|---|" + "---|" * len(targets)]
    for scenario in scenarios:
        cells = [_cell(by.get((scenario, t), [])) for t in targets]
        lines.append(f"| {scenario} | " + " | ".join(cells) + " |")
    lines += ["", "## Violations", ""]
    broken = [r for r in results if r.violations]
    lines += [f"- {r.target} / {r.scenario} / seed {r.seed}: {v}" for r in broken for v in r.violations]
    lines += [] if broken else ["none"]
    notes = [r for r in results if r.tolerated or r.note]
    if notes:
        lines += ["", "## Notes (tolerated by the scenario, or why not applicable)", ""]
        lines += [f"- {r.target} / {r.scenario} / seed {r.seed}: {n}" for r in notes
                  for n in ([r.note] if r.note else []) + r.tolerated]
    if skipped:
        lines += ["", "## Skipped targets (not installed)", ""]
        lines += [f"- {name}: {reason}" for name, reason in skipped]
    return "\n".join(lines) + "\n"


def _cell(rows: list[TargetResult]) -> str:
    if not rows:
        return "-"
    outcomes = _counted([r.outcome for r in rows])
    if all(r.outcome == "not_applicable" for r in rows):
        return "not_applicable"
    latencies = [r.detection_latency_s for r in rows if r.detection_latency_s is not None]
    detect = ("detect " + "/".join(f"{percentile(latencies, q) * 1e3:.0f}" for q in (50, 99))
              + " ms") if latencies else "no error seen"
    cause = "cause " + _counted([r.cause_named for r in rows])
    orphans = sum(len(r.orphans) for r in rows)
    roles = _counted([o["role"] for r in rows for o in r.orphans])
    orphan_text = f"orphans {orphans} ({roles})" if orphans else "no orphans"
    leftovers = sum(len(r.leftovers) for r in rows)
    bad = "" if all(r.ok for r in rows) else " **FAIL**"
    return (f"{outcomes}{bad}; {detect}; {cause}; {orphan_text}; "
            f"{'leftovers ' + str(leftovers) if leftovers else 'no leftovers'}")


def _counted(values: list[str]) -> str:
    seen: dict[str, int] = {}
    for v in values:
        seen[v] = seen.get(v, 0) + 1
    return ", ".join(v if n == 1 and len(values) == 1 else f"{v} ×{n}" for v, n in seen.items())


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), for a few seeds."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


# ------------------------------------------------------------------ JUnit and the summary


def write_junit(results: list[TargetResult], suite_name: str, target: str, path: Path) -> None:
    failures = sum(not r.ok for r in results)
    skipped = sum(r.outcome == "not_applicable" for r in results)
    wall = sum(r.wall_s for r in results)
    suite = ET.Element("testsuite", name=f"chaos.{suite_name}.{target}", tests=str(len(results)),
                       failures=str(failures), errors="0", skipped=str(skipped), time=f"{wall:.3f}")
    for r in results:
        case = ET.SubElement(suite, "testcase", classname=f"chaos.{suite_name}.{target}",
                             name=f"{r.scenario}[seed={r.seed}]", time=f"{r.wall_s:.3f}")
        if r.violations:
            failure = ET.SubElement(case, "failure", message=r.violations[0][:200],
                                    type="InvariantViolation")
            failure.text = "\n".join(r.violations)
        elif r.outcome == "not_applicable":
            ET.SubElement(case, "skipped", message=r.note or "not applicable")
        ET.SubElement(case, "system-out").text = json.dumps(r.row(), default=str)
    path.parent.mkdir(parents=True, exist_ok=True)
    root = ET.Element("testsuites")
    root.append(suite)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)


def summary(results: list[TargetResult]) -> str:
    width = max([len(r.scenario) for r in results] + [8])
    lines = [f"{'scenario':<{width}}  {'target':11}  seed  {'result':6}  {'fault':11}  "
             f"{'outcome':14}  {'detect ms':>9}  {'cause':7}  orphans  leftovers  wall s"]
    for r in results:
        latency = "" if r.detection_latency_s is None else f"{r.detection_latency_s * 1e3:.1f}"
        lines.append(f"{r.scenario:<{width}}  {r.target:11}  {r.seed:4}  {_verdict(r, 6):6}  "
                     f"{r.fault:11}  {r.outcome:14}  {latency:>9}  {r.cause_named:7}  "
                     f"{len(r.orphans):7}  {len(r.leftovers):9}  {r.wall_s:6.2f}")
        lines += [f"    {v}" for v in r.violations]
        lines += [f"    tolerated: {v}" for v in r.tolerated]
        lines += [f"    note: {r.note}"] if r.note else []
    failed = sum(not r.ok for r in results)
    lines.append(f"\n{len(results) - failed} passed, {failed} failed")
    return "\n".join(lines) + "\n"


def _verdict(r: TargetResult, width: int = 0) -> str:
    if r.outcome == "not_applicable":
        return "n/a"
    return "ok" if r.ok else ("FAIL" if width else f"FAIL ({len(r.violations)} violation(s))")


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 6)


def stderr_progress(text: str) -> None:
    sys.stderr.write(text)
    sys.stderr.flush()
