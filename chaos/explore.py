"""``explore``: run swarm scenarios until a budget ends; shrink, reproduce and file each failure.

    seed, seed+1, ... ──chaos.swarm.draw──► Scenario ──run_one──► result + history.jsonl
         │                                                  │ judge: oracles (minus "outcome")
         │                                                  │        + chaos.history_check
         │                                      Coverage ◄──┤
         │                                                  ▼ a failure
         │     triage: does it break an invariant no finding broke yet? ── no: a duplicate,
         │                                                  │ counted to the first finding it shares one with
         │                                                  │ yes: NEW = those invariants
         │       shrink: drop faults, drop calls, probability → on_call, while it still breaks
         │               one of NEW (a candidate failing only another way is rejected)
         │       reproduce k of n: a rerun counts when it breaks one of the finding's OWN
         │               invariants (NEW that the shrunk run still broke); k = 0: flaky
         │               (kept, flagged, filed in flaky.toml, never dropped)
         │       regressions suite ◄── the shrunk scenario ("Reproduce with: ...")
         └──────────── until the budget ends ──► coverage.md/json, junit.xml, explore.json

    OUT/scenarios/swarm-SEED/   each run: scenario.json, swarm.json, result.json, history.jsonl
                                (trace/ and ctl/ kept only for failures)
    OUT/scenarios/recovery-SEED/  a seed of the recovery family (chaos.swarm_recovery, about 1
                                in 10: generation under the restart policy, maybe a second fault
                                while it recovers); swarm.json says which family a seed drew
    OUT/findings/SIGNATURE/     run/ (the shrunk scenario: what replay takes), repro-K/

Judging: every invariant of chaos.oracles holds for any workload except "outcome" (the
outcome table's expectation is written for the suites' workloads: a swarm's ``fail`` calls
and late sleeps change the observed outcome without breaking anything); the history checker
adds its classes; a hang is judged at ``workload_bound_s`` (every call's deadline plus
slack, in a row), not the suites' minute.  The budget bounds the exploring; shrinking and
reproducing a finding are bounded on their own (``Limits``).  Processes a broken executor
leaves behind are SIGKILLed after each run (they are the explore's own children).
The search's own decisions are functions here that chaos.targets.explore shares, so one test
covers both loops (tests/judges/test_judges_search.py): ``new_invariants`` / ``triage`` (is it
the same bug), ``still_fails`` / ``shrink`` (is a candidate the same failure), ``own_invariants``
/ ``reproduces`` (did a rerun reproduce it), ``FindingOf.flaky`` and ``exit_status`` (does the
command fail).  Dedupe rule: a run is a new finding when it breaks an invariant no finding has
broken (signatures (A,B) then (B,C): two findings, the second about C; a bug seen in every run,
like a target's leak, does not hide the others); otherwise it is a duplicate of the first
finding sharing an invariant.  Exit status: 1 when a finding reproduced at least once; flaky
findings (0 of n) are reported and filed, never a failure of the command.
A recovery seed is judged by chaos.recovery's oracles (no history: chaos.swarm_recovery says
why); its shrink only drops the second fault.  Aimed at a planted Recovery (CountsNoMismatch,
KeepsRebuiltToken), explore runs the recovery seeds only: a plain seed cannot reach it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar
from xml.etree import ElementTree as ET

import psutil

from chaos import history, history_check, swarm, swarm_recovery, swarm_surroundings
from chaos.coverage import Coverage
from chaos.faults import fault_from_dict
from chaos.oracles import Bounds
from chaos.recovery import RecoveryResult, RecoveryScenario
from chaos.regressions import append_scenario
from chaos.runner import run_one, slug
from chaos.scenario import ScenarioResult
from chaos.suites import Scenario

IGNORED = frozenset({"outcome"})
# shutdown() may take its graces (0.3 s + 0.3 s in the swarm's config) plus this: the real
# executor took at most 0.66 s in 222 explored runs at load 12-24, a stall of 1.5 s is caught.
SHUTDOWN_SLACK_S = 0.8
_HELPERS = ("forkserver", "resource_tracker")
Say = Callable[[str], None]
AnyScenario = Scenario | RecoveryScenario


class _Filed(Protocol):
    def to_dict(self) -> dict[str, Any]: ...


S = TypeVar("S", bound=_Filed)  # the kind of scenario a finding is about


@dataclasses.dataclass(frozen=True)
class Limits:
    shrink_runs: int = 40  # candidate runs per finding
    shrink_s: float = 120.0  # a run that waits out an orphan bound is ~5 s
    reproductions: int = 3


@dataclasses.dataclass
class Verdict:
    result: ScenarioResult | RecoveryResult
    events: list[dict[str, Any]]
    problems: list[str]  # "[invariant] message" and "history.kind: message"

    @property
    def signature(self) -> frozenset[str]:
        return signature_of(self.problems)


def budget_seeds(t0: float, budget_s: float, first: int, max_findings: int | None,
                 findings: list[Any]) -> Iterator[int]:
    """``first``, ``first + 1``, ... until ``budget_s`` has passed since ``t0`` or
    ``findings`` holds ``max_findings``."""
    seed = first
    while time.monotonic() - t0 < budget_s and (max_findings is None or len(findings) < max_findings):
        yield seed
        seed += 1


class _Signed(Protocol):
    @property
    def signature(self) -> frozenset[str]: ...


V = TypeVar("V", bound=_Signed)  # a verdict: what one run broke
C = TypeVar("C")  # a candidate scenario


def new_invariants(signature: frozenset[str], known: Sequence[frozenset[str]]) -> frozenset[str]:
    """What of ``signature`` no earlier finding (``known``: their signatures) has broken:
    empty, the run is a duplicate."""
    return signature - frozenset().union(*known)


def triage(findings: Sequence[FindingOf[Any]], signature: frozenset[str]) -> frozenset[str]:
    """The invariants a failing run (``signature``) is a NEW finding about; empty when it is
    a duplicate, then counted to the first finding that shares one of its invariants."""
    new = new_invariants(signature, [f.signature for f in findings])
    if signature and not new:
        next(f for f in findings if f.signature & signature).duplicates += 1
    return new


def still_fails(tried: frozenset[str], wanted: frozenset[str]) -> bool:
    """A shrink candidate is kept when its run breaks one of the invariants the finding is
    about (``wanted``); a run failing only another way is a different failure."""
    return bool(tried & wanted)


def shrink(scenario: C, verdict: V, wanted: frozenset[str],
           candidates_of: Callable[[C], Sequence[C]], run: Callable[[C, int], V],
           limits: Limits, clock: Callable[[], float] = time.monotonic) -> tuple[C, V]:
    """Greedy shrinking: try ``candidates_of(best)`` in their order (the boldest first); the
    first that ``still_fails`` becomes the new best and its candidates are tried next; it ends
    when no candidate of the best still fails, after ``limits.shrink_runs`` runs (``run(c, k)``:
    the k-th, from 1) or ``limits.shrink_s``.  Returns the best and ITS verdict."""
    deadline = clock() + limits.shrink_s
    runs, best, best_verdict, progress = 0, scenario, verdict, True
    while progress and runs < limits.shrink_runs and clock() < deadline:
        progress = False
        for candidate in candidates_of(best):
            if runs >= limits.shrink_runs or clock() >= deadline:
                break
            runs += 1
            tried = run(candidate, runs)
            if still_fails(tried.signature, wanted):
                best, best_verdict, progress = candidate, tried, True
                break
    return best, best_verdict


def own_invariants(shrunk: frozenset[str], wanted: frozenset[str]) -> frozenset[str]:
    """A finding's own invariants: the new ones (``wanted``) its shrunk run still broke (never
    empty: the shrunk run is the original or a candidate that still failed)."""
    return (shrunk & wanted) or wanted


def reproduces(rerun: frozenset[str], own: frozenset[str]) -> bool:
    """A rerun reproduces a finding when it breaks one of the finding's own invariants
    (others beside them do not matter); a rerun that passes, or fails only another way,
    does not."""
    return bool(rerun & own)


def exit_status(findings: Sequence[FindingOf[Any]]) -> int:
    """explore's exit status: 1 when a finding reproduced (k >= 1 of n), 0 otherwise; a flaky
    finding is reported and filed in flaky.toml, not a failure of the command."""
    return 1 if any(not f.flaky for f in findings) else 0


def signature_of(problems: list[str]) -> frozenset[str]:
    """The invariants and history classes ``problems`` break (a finding's identity)."""
    return frozenset(p.split("]")[0].lstrip("[") if p.startswith("[") else p.split(":")[0]
                     for p in problems)


@dataclasses.dataclass
class FindingOf(Generic[S]):
    """One failure, as filed: what broke, where it was first seen, its shrunk schedule and
    how often that reproduced (``S``: the kind of scenario it is about)."""

    signature: frozenset[str]
    seed: int
    found_after_s: float
    original: S
    shrunk: S
    problems: list[str]
    run_dir: Path
    reproduced: int = 0
    tries: int = 0
    duplicates: int = 0
    own: frozenset[str] = frozenset()  # what it is about: the invariants no earlier finding
    #                                    broke that its shrunk run broke (own_invariants)

    @property
    def flaky(self) -> bool:
        return self.reproduced == 0

    @property
    def name(self) -> str:
        return "+".join(sorted(self.signature))

    def schedule_length(self, scenario: S) -> int:
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        return {"signature": sorted(self.signature), "seed": self.seed,
                "found_after_s": round(self.found_after_s, 2), "flaky": self.flaky,
                "reproduced": self.reproduced, "tries": self.tries, "duplicates": self.duplicates,
                "own_invariants": sorted(self.own),
                "schedule_length": self.schedule_length(self.shrunk),
                "original_length": self.schedule_length(self.original),
                "problems": self.problems, "run_dir": str(self.run_dir),
                "scenario": self.shrunk.to_dict()}


@dataclasses.dataclass
class Finding(FindingOf[AnyScenario]):
    def schedule_length(self, scenario: AnyScenario) -> int:
        """Faults plus calls; a named workload (an edge workload: no calls of its own) is one;
        a recovery scenario's faults (its generation has no calls of its own)."""
        if isinstance(scenario, RecoveryScenario):
            return swarm_recovery.schedule_length(scenario)
        return len(scenario.faults) + (len(scenario.calls) or 1)


@dataclasses.dataclass
class Exploration:
    out: Path
    executor: str = ""  # "module:Class"; "" the real executor
    seed: int = 0
    limits: Limits = Limits()
    regressions: Path | None = None  # where findings are filed (None: OUT/regressions.toml)
    say: Say = print
    max_findings: int | None = None  # stop exploring once this many are filed
    coverage: Coverage = dataclasses.field(default_factory=Coverage)
    findings: list[Finding] = dataclasses.field(default_factory=list)
    runs: int = 0
    skipped: int = 0  # plain seeds passed over: aimed at a planted Recovery

    def run(self, budget_s: float) -> list[Finding]:
        t0 = time.monotonic()
        return self.run_seeds(budget_seeds(t0, budget_s, self.seed, self.max_findings,
                                           self.findings), t0)

    def run_seeds(self, seeds: Iterable[int], t0: float | None = None) -> list[Finding]:
        """Explore exactly ``seeds`` (run() draws them until its budget ends; a test names
        them); then write the reports."""
        t0 = time.monotonic() if t0 is None else t0
        for seed in seeds:
            self._explore_one(seed, t0)
        self._write_reports(time.monotonic() - t0)
        return self.findings

    def _explore_one(self, seed: int, t0: float) -> None:
        recovery = swarm_recovery.draw(seed, self.executor)
        if recovery is not None or swarm_recovery.planted(self.executor):
            self._explore_recovery(seed, t0, recovery)
            return
        drawn = swarm.draw(seed)
        scenario = drawn.scenario(self.executor)
        where = self.out / "scenarios" / f"swarm-{seed}"
        verdict = judge(scenario, seed, where)
        (where / "swarm.json").write_text(json.dumps({"family": "plain", **drawn.to_dict()},
                                                     indent=1))
        self.runs += 1
        assert isinstance(verdict.result, ScenarioResult)
        self.coverage.add(verdict.result, drawn.start_method, verdict.events,
                          lambda r: swarm.fault_site(scenario.faults[r["index"]]))
        self.coverage.surroundings[drawn.surrounding] += 1
        if swarm.STUBBORN in scenario.calls:  # a site that is a call, not a fault
            self.coverage.sites["stubborn_worker"] += 1
        self._judged(seed, t0, scenario, verdict, where)

    def _explore_recovery(self, seed: int, t0: float, scenario: RecoveryScenario | None) -> None:
        if scenario is None:  # a planted Recovery: only the recovery family runs it
            self.skipped += 1
            return
        where = self.out / "scenarios" / f"recovery-{seed}"
        verdict = judge(scenario, seed, where)
        (where / "swarm.json").write_text(json.dumps(
            {"family": "recovery", "seed": seed, "recovery": scenario.to_dict()}, indent=1))
        self.runs += 1
        assert isinstance(verdict.result, RecoveryResult)
        self.coverage.add_recovery(verdict.result, swarm_recovery.sites_hit(verdict.result, scenario),
                                   swarm_recovery.interrupted(verdict.result))
        self._judged(seed, t0, scenario, verdict, where)

    def _judged(self, seed: int, t0: float, scenario: AnyScenario, verdict: Verdict,
                where: Path) -> None:
        if not verdict.problems:
            _drop_traces(where)
            return
        new = triage(self.findings, verdict.signature)
        if not new:
            return
        found_after = time.monotonic() - t0
        self.say(f"seed {seed}: {verdict.problems[0][:200]} ({found_after:.1f} s in); shrinking")
        self.findings.append(self._file(self._shrink(scenario, seed, verdict, new), seed,
                                        found_after, scenario, new))

    def _judge(self, scenario: AnyScenario, seed: int, where: Path) -> Verdict:
        return judge(scenario, seed, where)

    def _shrink(self, scenario: AnyScenario, seed: int, verdict: Verdict,
                wanted: frozenset[str]) -> tuple[AnyScenario, Verdict]:
        found = shrink(scenario, verdict, wanted, lambda s: candidates(s, seed),
                       lambda c, k: self._judge(c, seed, self.out / "shrinking" / f"{seed}-{k}"),
                       self.limits)
        shutil.rmtree(self.out / "shrinking", ignore_errors=True)
        return found

    def _file(self, shrunk: tuple[AnyScenario, Verdict], seed: int, found_after: float,
              original: AnyScenario, new: frozenset[str]) -> Finding:
        scenario, verdict = shrunk
        label = slug("+".join(sorted(verdict.signature)))
        scenario = _renamed(scenario, f"explore-{label}-{seed}", seed)
        home = self.out / "findings" / slug(scenario.name)
        own = own_invariants(verdict.signature, new)
        finding = Finding(verdict.signature, seed, found_after, original, scenario,
                          verdict.problems, home / "run", own=own)
        self._judge(scenario, seed, finding.run_dir)  # the run that replay takes
        for k in range(self.limits.reproductions):
            again = self._judge(scenario, seed, home / f"repro-{k + 1}")
            finding.tries += 1
            finding.reproduced += reproduces(again.signature, own)
        self._announce(finding)
        if not finding.flaky:
            path = self.regressions or self.out / "regressions.toml"
            append_scenario(path, scenario, f"{finding.name}: {verdict.problems[0][:300]}")
        else:
            append_scenario(self.out / "flaky.toml", scenario, f"FLAKY {finding.name}")
        return finding

    def _announce(self, f: Finding) -> None:
        state = "FLAKY (did not reproduce)" if f.flaky else "reproduced"
        self.say(f"FOUND {f.name} at seed {f.seed} after {f.found_after_s:.1f} s: "
                 f"{f.problems[0][:300]}\n  shrunk from {f.schedule_length(f.original)} to "
                 f"{f.schedule_length(f.shrunk)} steps ({_what_ran(f.shrunk)}); "
                 f"{state} {f.reproduced} of {f.tries}\n"
                 f"  Reproduce with: faultlab chaos replay {f.run_dir}")

    def _write_reports(self, wall_s: float) -> None:
        sites = list(dict.fromkeys(  # a hang's two durations are one site by name
            [swarm.site_name(s) for s in swarm.SITES] + ["stubborn_worker", *swarm_recovery.SITES]))
        (self.out / "coverage.json").write_text(json.dumps(self.coverage.to_dict(sites), indent=1))
        (self.out / "coverage.md").write_text(self.coverage.table(sites))
        (self.out / "explore.json").write_text(json.dumps({
            "executor": self.executor or "executor:MultiprocExecutor", "first_seed": self.seed,
            "runs": self.runs, "plain_seeds_skipped": self.skipped, "wall_s": round(wall_s, 1),
            "findings": [f.to_dict() for f in self.findings]}, indent=1, default=str))
        write_junit(self.findings, self.runs, self.out / "junit.xml", wall_s)


def _renamed(scenario: AnyScenario, name: str, seed: int) -> AnyScenario:
    """``scenario`` named ``name``; a recovery scenario keeps its fault step (drawn from the
    seed and the name), pinned."""
    if isinstance(scenario, RecoveryScenario):
        step = scenario.fault_step(seed)
        return dataclasses.replace(scenario, name=name, steps=(step, step))
    return dataclasses.replace(scenario, name=name)


def _what_ran(scenario: AnyScenario) -> str:
    if isinstance(scenario, RecoveryScenario):  # its only shrink: the second fault dropped
        return (f"{swarm_recovery.schedule_length(scenario)} fault(s) in "
                f"{swarm_recovery.describe(scenario)}; a recovery shrinks by its second fault only")
    return f"{len(scenario.faults)} fault(s), {_what_calls(scenario)}"


def _what_calls(scenario: Scenario) -> str:
    return f"{len(scenario.calls)} call(s)" if scenario.calls else f"the workload {scenario.workload}"


def judge(scenario: AnyScenario, seed: int, where: Path) -> Verdict:
    """Run ``scenario`` into ``where``; its history and every problem found."""
    started = time.time()
    if isinstance(scenario, RecoveryScenario):  # no history (chaos.swarm_recovery)
        recovered, found = swarm_recovery.judge(scenario, seed, where)
        _kill_leftovers(started)
        return Verdict(recovered, [], found)
    result = run_one(scenario, seed, where, scenario.config.get("start_method"),
                     Bounds(workload_s=workload_bound_s(scenario), shutdown_slack_s=SHUTDOWN_SLACK_S))
    _kill_leftovers(started)
    events = history.build(result.calls, result.trace_dir)
    history.write(where / history.FILE_NAME, events)
    problems = [str(v) for v in result.violations if v.invariant not in IGNORED]
    problems += [str(v) for v in history_check.check(events)]
    return Verdict(result, events, problems)


def workload_bound_s(scenario: Scenario) -> float:
    """When a swarm workload has hung: each call ends by its deadline plus 1 s of slack, one
    after another at worst (a hung worker), plus 5 s; far below the suites' 60 s.  A named
    workload (an edge workload, the outsider flood) has its own bound."""
    if not scenario.calls:
        return swarm_surroundings.workload_bound_s(scenario.workload)
    return sum((c.timeout or 10.0) + 1.0 for c in scenario.calls) + 5.0


def candidates(scenario: AnyScenario, seed: int) -> list[AnyScenario]:
    """Smaller schedules to try, the boldest first: every probability trigger made the
    first call it drew; each fault dropped; runs of calls dropped (``_chunks``).  A recovery
    scenario: without its second fault."""
    if isinstance(scenario, RecoveryScenario):
        return list(swarm_recovery.candidates(scenario))
    out: list[AnyScenario] = []
    fixed = _fixed_triggers(scenario, seed)
    if fixed is not None:
        out.append(fixed)
    for i in range(len(scenario.faults)):
        faults = scenario.faults[:i] + scenario.faults[i + 1:]
        out.append(dataclasses.replace(scenario, faults=faults,
                                       may_not_fire=tuple(range(len(faults)))))
    for start, stop in _chunks(len(scenario.calls)):
        fewer = scenario
        for j in reversed(range(start, stop)):
            fewer = _without_call(fewer, j)
        out.append(fewer)
    return out


def _chunks(n: int) -> list[tuple[int, int]]:
    """Runs of calls to drop, as ddmin tries them: halves, then quarters, ... then single
    calls, the last first; never all of them (a run is seconds: a long schedule shrinks in a
    few runs instead of one per call)."""
    out: list[tuple[int, int]] = []
    size = n // 2
    while size >= 1:
        for stop in range(n, 0, -size):
            chunk = (max(0, stop - size), stop)
            if chunk not in out and chunk[1] - chunk[0] < n:
                out.append(chunk)
        size //= 2
    return out


def _without_call(scenario: Scenario, j: int) -> Scenario:
    """``scenario`` without call ``j``; an ``on_call`` fault still hits the call it hit (its
    count moves down past the dropped call), or, when it hit call ``j``, the next call of
    the same kind."""
    dropped = scenario.calls[j].method
    faults = []
    for fault in scenario.faults:
        if fault.on_call is not None:
            method, k = fault.on_call
            before = sum(method in ("*", c.method) for c in scenario.calls[:j])
            if method in ("*", dropped) and before < k - 1:
                fault = dataclasses.replace(fault, on_call=(method, k - 1))
        faults.append(fault)
    return dataclasses.replace(scenario, calls=scenario.calls[:j] + scenario.calls[j + 1:],
                               faults=tuple(faults))


def _fixed_triggers(scenario: Scenario, seed: int) -> Scenario | None:
    """Each probability fault on the first call its seed drew (seed-free, one firing); an
    outside_reaper due at 0 (it reaps until shutdown, so from the start covers any later
    start, and a workload shrunk to one short call cannot end before it fires)."""
    resolved = scenario.plan(seed).resolve()
    if not any(f.probability is not None or _reaper_due_later(f) for f in scenario.faults):
        return None
    faults = []
    for fault, r in zip(scenario.faults, resolved, strict=True):
        if _reaper_due_later(fault):
            faults.append(dataclasses.replace(fault, at=0.0))
            continue
        if fault.probability is None or not r.calls:
            faults.append(fault)
            continue
        data = {k: v for k, v in fault.to_dict().items() if k not in ("probability", "calls_of")}
        faults.append(fault_from_dict({**data, "on_call": [r.method, min(r.calls)]}))
    return dataclasses.replace(scenario, faults=tuple(faults))


def _reaper_due_later(fault: Any) -> bool:
    return fault.kind == "outside_reaper" and fault.at not in (0, 0.0, None)


class Reported(Protocol):
    """What a JUnit case is written from (a Finding, or a chaos.targets.explore finding)."""

    @property
    def name(self) -> str: ...
    @property
    def flaky(self) -> bool: ...
    @property
    def found_after_s(self) -> float: ...
    @property
    def problems(self) -> list[str]: ...
    @property
    def run_dir(self) -> Path: ...


def write_junit(findings: Sequence[Reported], runs: int, path: Path, wall_s: float,
                classname: str = "chaos.explore") -> None:
    suite = ET.Element("testsuite", name=classname, tests=str(max(1, len(findings))),
                       failures=str(sum(not f.flaky for f in findings)),
                       errors="0", skipped=str(sum(f.flaky for f in findings)), time=f"{wall_s:.3f}")
    if not findings:
        ET.SubElement(suite, "testcase", classname=classname, name=f"explored {runs} scenarios")
    for f in findings:
        case = ET.SubElement(suite, "testcase", classname=classname, name=f.name,
                             time=f"{f.found_after_s:.3f}")
        tag = "skipped" if f.flaky else "failure"
        node = ET.SubElement(case, tag, message=("flaky: " if f.flaky else "") + f.problems[0][:200])
        node.text = "\n".join(f.problems) + f"\nReproduce with: faultlab chaos replay {f.run_dir}"
    root = ET.Element("testsuites")
    root.append(suite)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)


def _drop_traces(where: Path) -> None:
    for name in ("trace", "ctl"):
        shutil.rmtree(where / name, ignore_errors=True)


def _kill_leftovers(since: float) -> None:
    """SIGKILL this process's children started by the run (a broken shutdown's workers),
    never multiprocessing's own helpers (the forkserver, the resource tracker)."""
    for child in psutil.Process(os.getpid()).children(recursive=True):
        try:
            helper = any(h in " ".join(child.cmdline()) for h in _HELPERS)
            if child.create_time() >= since - 1.0 and not helper:
                child.send_signal(signal.SIGKILL)
                child.wait(5)
        except (psutil.NoSuchProcess, psutil.TimeoutExpired):
            pass
