"""Running a suite: each scenario into its own directory, a summary, JUnit XML.

    DIR/<scenario>/scenario.json   the scenario definition and seed (what replay reruns)
    DIR/<scenario>/plan.json       the fault plan and executor config
    DIR/<scenario>/result.json     calls, fault timeline, violations, latencies
    DIR/<scenario>/trace/          the journal of every process (telemetry.load_run)
    DIR/summary.json               one row per scenario
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO
from xml.etree import ElementTree as ET

from chaos.oracles import Bounds
from chaos.recovery import RecoveryResult, run_recovery
from chaos.scenario import ScenarioResult, run_scenario
from chaos.suites import Scenario, Suite

Progress = Callable[[int, int, Any, Any], None]  # (i, n, scenario, its result or None)
AnyResult = ScenarioResult | RecoveryResult


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "scenario"


def run_one(scenario: Scenario, seed: int, out: Path, start_method: str | None = None,
            bounds: Bounds | None = None) -> ScenarioResult:
    out.mkdir(parents=True, exist_ok=True)
    (out / "scenario.json").write_text(json.dumps(
        {"seed": seed, "start_method": start_method, "scenario": scenario.to_dict()}, indent=2))
    return run_scenario(scenario.executor_config(start_method), scenario.build_workload(),
                        scenario.plan(seed), out, name=scenario.name, expected=scenario.expect,
                        may_not_fire=scenario.may_not_fire, executor_class=scenario.executor_class(),
                        bounds=bounds)


def run_suite(suite: Suite, seed: int, out: Path, progress: Progress | None = None,
              start_method: str | None = None, only: str | None = None) -> list[ScenarioResult]:
    scenarios = [s for s in suite.scenarios if only is None or re.search(only, s.name)]
    recovery = [s for s in suite.recovery if only is None or re.search(only, s.name)]
    total = len(scenarios) + len(recovery)
    results: list[Any] = []
    for i, scenario in enumerate(scenarios):
        if progress:
            progress(i, total, scenario, None)
        result = run_one(scenario, seed, out / slug(scenario.name), start_method)
        results.append(result)
        if progress:
            progress(i, total, scenario, result)
    for i, rscenario in enumerate(recovery, start=len(scenarios)):
        if progress:
            progress(i, total, rscenario, None)
        rresult = run_recovery(rscenario, seed, out / slug(rscenario.name))
        results.append(rresult)
        if progress:
            progress(i, total, rscenario, rresult)
    (out / "summary.json").write_text(json.dumps([summary_row(r) for r in results], indent=2))
    return results


def summary_row(r: AnyResult) -> dict[str, Any]:
    return {"name": r.name, "ok": r.ok, "recovered": _recovered(r),
            "expected": r.expected and r.expected.value,
            "outcome": r.outcome and r.outcome.value, "faults": len(r.faults),
            "detection_latency_s": r.detection_latency_s, "wall_s": round(r.wall_s, 3),
            "tokens_per_s": _throughput(r),
            "violations": [str(v) for v in r.violations]}


def _recovered(r: AnyResult) -> str:
    """The "recovered" column: yes/no for recovery scenarios, "-" for the others."""
    if not isinstance(r, RecoveryResult):
        return "-"
    return "yes" if r.recovered else "no"


def _throughput(r: AnyResult) -> str:
    """The "tok/s base/during/after" column: recovery scenarios only ("-" for a missing one)."""
    if not isinstance(r, RecoveryResult):
        return "-"
    rates = (r.baseline_tokens_per_s, r.during_tokens_per_s, r.after_tokens_per_s)
    return "/".join("-" if x is None else f"{x:.0f}" for x in rates)


def print_summary(results: list[AnyResult], stream: TextIO | None = None) -> None:
    stream = stream or sys.stdout  # looked up now: a bound default outlives a replaced stdout
    width = max([len(r.name) for r in results] + [8])
    stream.write(f"{'scenario':<{width}}  {'result':6}  {'expected':13}  {'observed':13}  "
                 f"{'detect ms':>9}  {'wall s':>6}  recovered  tok/s base/during/after\n")
    for r in results:
        latency = "" if r.detection_latency_s is None else f"{r.detection_latency_s * 1e3:.1f}"
        stream.write(f"{r.name:<{width}}  {'ok' if r.ok else 'FAIL':6}  "
                     f"{(r.expected and r.expected.value) or '-':13}  "
                     f"{(r.outcome and r.outcome.value) or '-':13}  {latency:>9}  {r.wall_s:6.2f}"
                     f"  {_recovered(r):9}  {_throughput(r)}\n")
        for v in r.violations:
            stream.write(f"    {v}\n")
        for index in _unfired_allowed(r):
            stream.write(f"    note: planned fault {index} never fired (declared may_not_fire)\n")
    failed = sum(not r.ok for r in results)
    stream.write(f"\n{len(results) - failed} passed, {failed} failed\n")


def _unfired_allowed(r: AnyResult) -> list[int]:
    """Faults that never fired without a violation: shown, so that no pass is silent."""
    return [i for i in getattr(r, "unfired", []) if i in getattr(r, "may_not_fire", [])]


def write_junit(results: list[AnyResult], suite_name: str, path: Path, wall_s: float) -> None:
    failures = sum(not r.ok for r in results)
    suite = ET.Element("testsuite", name=f"chaos.{suite_name}", tests=str(len(results)),
                       failures=str(failures), errors="0", time=f"{wall_s:.3f}")
    for r in results:
        case = ET.SubElement(suite, "testcase", classname=f"chaos.{suite_name}", name=r.name,
                             time=f"{r.wall_s:.3f}")
        if r.violations:
            text = "\n".join(str(v) for v in r.violations)
            failure = ET.SubElement(case, "failure", message=str(r.violations[0])[:200],
                                    type="InvariantViolation")
            failure.text = text
        ET.SubElement(case, "system-out").text = json.dumps(
            {"seed": r.seed, "faults": r.faults, "out_dir": str(r.out_dir)}, default=str)
    path.parent.mkdir(parents=True, exist_ok=True)
    root = ET.Element("testsuites")
    root.append(suite)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)


def stderr_progress(i: int, n: int, scenario: Any, result: Any) -> None:
    if result is None:
        sys.stderr.write(f"[{i + 1}/{n}] {scenario.name} ... ")
    else:
        status = "ok" if result.ok else f"FAIL ({len(result.violations)} violation(s))"
        sys.stderr.write(f"{status} in {result.wall_s:.2f} s\n")
    sys.stderr.flush()


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    t0 = time.monotonic()
    return fn(), time.monotonic() - t0
