"""Issue 31, the search's own judges: explore's dedupe, shrink, reproduce, flaky flag and exit
status (chaos.explore, shared by chaos.targets.explore), each with fire and quiet cases on
made-up signatures and findings and on a scripted fake executor (no processes: a run's
signature is a function of its scenario), and every plant of chaos.planted_judges.search
shown caught by them.

    CASES ──run plain──► all pass (the judges are right)
    CASES ──under each plant──► at least one fails (the plant is caught)
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from judge_cases import assert_caught, case_id

from chaos import explore
from chaos.explore import Exploration, Finding, Limits, Verdict
from chaos.planted_judges import PlantedJudge, planted_in
from chaos.suites import Scenario, load_suite
from chaos.targets.explore import TargetExploration, TargetVerdict
from chaos.targets.scenario import TargetScenario
from chaos.workloads import CallSpec

A, B, C = frozenset({"A"}), frozenset({"B"}), frozenset({"C"})


def _finding(signature: frozenset[str], reproduced: int = 1, tries: int = 3) -> Finding:
    s = Scenario("s", {}, ())
    return Finding(signature, 0, 0.0, s, s, ["[x] y"], Path("."), reproduced, tries)


# ------------------------------------------------------------------ dedupe


def case_a_failure_sharing_an_invariant_with_a_finding_is_its_duplicate() -> None:
    assert explore.new_invariants(A, [A | B]) == frozenset()
    assert explore.new_invariants(A | B, [A | B]) == frozenset()
    assert explore.new_invariants(A | B, [A, B]) == frozenset()  # each covered by one


def case_disjoint_failures_are_two_findings() -> None:
    assert explore.new_invariants(C, [A | B]) == C
    assert explore.new_invariants(A, []) == A


def case_overlapping_AB_then_BC_is_a_new_finding_about_C_only() -> None:
    """The rule: new = what no finding broke; a bug seen beside another (a target's leak in
    every run) does not hide it, and the new finding is about C alone."""
    assert explore.new_invariants(B | C, [A | B]) == C
    assert explore.new_invariants(frozenset({"A", "Z"}), [A | B]) == {"Z"}


def case_a_duplicate_is_counted_to_the_first_finding_it_shares_with() -> None:
    first, second = _finding(A), _finding(B)
    assert explore.triage([first, second], A | B) == frozenset()
    assert (first.duplicates, second.duplicates) == (1, 0)
    assert explore.triage([first, second], B) == frozenset()
    assert (first.duplicates, second.duplicates) == (1, 1)


def case_a_new_or_passing_run_counts_no_duplicate() -> None:
    first = _finding(A)
    assert explore.triage([first], A | C) == C
    assert explore.triage([first], frozenset()) == frozenset()
    assert first.duplicates == 0


# ------------------------------------------------------------------ shrink


Steps = tuple[str, ...]


def _drop_one(s: Steps) -> list[Steps]:
    return [s[:i] + s[i + 1:] for i in range(len(s))]


def _fake_run(fails: Callable[[Steps], frozenset[str]],
              tried: list[Steps]) -> Callable[[Steps, int], SimpleNamespace]:
    def run(candidate: Steps, k: int) -> SimpleNamespace:
        tried.append(candidate)
        assert k == len(tried)
        return SimpleNamespace(signature=fails(candidate), steps=candidate)
    return run


def _x_needs_a(s: Steps) -> frozenset[str]:
    """X needs step a; without it, b alone fails ANOTHER way (Y)."""
    return frozenset({"X"}) if "a" in s else (frozenset({"Y"}) if "b" in s else frozenset())


def _shrunk(fails: Callable[[Steps], frozenset[str]], start: Steps, wanted: frozenset[str],
            limits: Limits | None = None) -> tuple[Steps, Any, list[Steps]]:
    tried: list[Steps] = []
    first = SimpleNamespace(signature=fails(start), steps=start)
    best, verdict = explore.shrink(start, first, wanted, _drop_one, _fake_run(fails, tried),
                                   limits or Limits())
    return best, verdict, tried


def case_shrink_rejects_a_candidate_failing_another_way() -> None:
    best, verdict, tried = _shrunk(_x_needs_a, ("a", "b", "c"), frozenset({"X"}))
    assert best == ("a",) and verdict.signature == {"X"}
    # the documented order: candidates of the best, first accepted becomes the best
    assert tried == [("b", "c"), ("a", "c"), ("c",), ("a",), ()]


def case_shrink_never_ends_on_a_failure_sharing_nothing_with_the_original() -> None:
    for start in [("a", "b", "c"), ("b", "a"), ("c", "b", "a", "b")]:
        _, verdict, _ = _shrunk(_x_needs_a, start, frozenset({"X"}))
        assert verdict.signature & {"X"}, (start, verdict.signature)


def case_shrink_keeps_a_candidate_that_breaks_one_of_the_wanted() -> None:
    def fails(s: Steps) -> frozenset[str]:
        return frozenset({"X"} if "a" in s else set()) | frozenset({"Z"} if "z" in s else set())
    best, verdict, _ = _shrunk(fails, ("a", "z"), frozenset({"X", "Z"}))
    assert best in {("a",), ("z",)} and len(verdict.signature) == 1


def case_shrink_returns_the_verdict_of_the_shrunk_run() -> None:
    best, verdict, _ = _shrunk(_x_needs_a, ("b", "a"), frozenset({"X"}))
    assert verdict.steps == best == ("a",)


def case_shrink_stops_at_its_run_bound_and_its_deadline() -> None:
    def never(s: Steps) -> frozenset[str]:
        return frozenset()
    best, _, tried = _shrunk(never, tuple("abcdef"), frozenset({"X"}), Limits(shrink_runs=3))
    assert len(tried) == 3 and best == tuple("abcdef")
    clock = iter([0.0, 0.0, 0.0, 5.0, 11.0, 11.0, 11.0])
    tried = []
    explore.shrink(tuple("abcdef"), SimpleNamespace(signature=frozenset({"X"})), frozenset({"X"}),
                   _drop_one, _fake_run(never, tried), Limits(shrink_s=10.0), lambda: next(clock))
    assert len(tried) == 2


def case_shrink_with_no_smaller_candidate_keeps_the_original() -> None:
    best, verdict, tried = _shrunk(_x_needs_a, ("a",), frozenset({"X"}))
    assert best == ("a",) and verdict.signature == {"X"} and tried == [()]


# ------------------------------------------------------------------ reproduce, flaky, exit


def case_a_rerun_breaking_one_of_its_invariants_reproduces_extra_ones_allowed() -> None:
    assert explore.reproduces(frozenset({"X"}), frozenset({"X"}))
    assert explore.reproduces(frozenset({"X", "W"}), frozenset({"X"}))
    assert explore.reproduces(frozenset({"X"}), frozenset({"X", "Z"}))


def case_a_rerun_failing_another_way_or_passing_is_not_reproduced() -> None:
    assert not explore.reproduces(frozenset({"Y"}), frozenset({"X"}))
    assert not explore.reproduces(frozenset(), frozenset({"X"}))


def case_a_rerun_breaking_only_an_earlier_findings_invariant_is_not_reproduced() -> None:
    """A target that leaks in every run: the orphans finding is not reproduced by a leak."""
    own = explore.own_invariants(frozenset({"leak", "orphan"}), frozenset({"orphan"}))
    assert own == {"orphan"}
    assert not explore.reproduces(frozenset({"leak"}), own)
    assert explore.own_invariants(frozenset({"X"}), frozenset({"X", "Z"})) == {"X"}


def case_zero_of_n_is_flaky_one_of_n_is_not() -> None:
    assert _finding(A, reproduced=0, tries=3).flaky
    assert not _finding(A, reproduced=1, tries=3).flaky
    assert not _finding(A, reproduced=3, tries=3).flaky


def case_flaky_findings_do_not_fail_the_command() -> None:
    flaky, real = _finding(A, 0, 3), _finding(B, 2, 3)
    assert explore.exit_status([]) == 0
    assert explore.exit_status([flaky]) == 0
    assert explore.exit_status([flaky, real]) == 1
    assert explore.exit_status([real]) == 1


# ------------------------------------------------------------------ the loops, on a fake executor


class _FakeExploration(Exploration):
    """faultlab's explore with a scripted executor: a call ``echo("A")`` trips bug X, a call
    ``echo("B")`` bug Y; with ``flaky`` set, a rerun ("repro-" dirs) of seed 0 fails another
    way (W) and of any other seed passes."""

    flaky = False

    def _judge(self, scenario: Any, seed: int, where: Path) -> Verdict:
        args = {c.args[0] for c in scenario.calls}
        rerun = where.name.startswith("repro-")
        problems = [f"[{bug}] bug {bug}" for arg, bug in (("A", "X"), ("B", "Y")) if arg in args]
        if rerun and self.flaky:
            problems = ["[W] another way"] if seed == 0 else []
        return Verdict(cast(Any, None), [], problems)


def _scenario(*args: str) -> Scenario:
    return Scenario(f"s-{''.join(args)}", {}, (), calls=tuple(CallSpec("echo", (a,), 1.0) for a in args))


def _explore_fake(out: Path, *runs: Scenario, flaky: bool = False) -> list[Finding]:
    ex = _FakeExploration(out, "chaos.mutants:WrongResults", say=lambda text: None)
    ex.flaky = flaky
    for seed, scenario in enumerate(runs):
        ex._judged(seed, time.monotonic(), scenario, ex._judge(scenario, seed, out / "r"), out / "r")
    return ex.findings


def case_explore_on_two_bugs_files_two_findings_shrunk_and_reproduced() -> None:
    with tempfile.TemporaryDirectory(prefix="judges-search-") as tmp:
        out = Path(tmp)
        findings = _explore_fake(out, _scenario("x", "A", "x"), _scenario("A", "B"), _scenario("x", "x"),
                                 _scenario("B", "x", "A", "x"), _scenario("x", "B"))
        filed = load_suite(str(out / "regressions.toml")).scenarios
    assert [f.signature for f in findings] == [{"X"}, {"Y"}]
    assert [f.own for f in findings] == [{"X"}, {"Y"}]
    assert [[c.args for c in f.shrunk.calls] for f in findings] == [[("A",)], [("B",)]]
    assert [(f.reproduced, f.tries, f.duplicates) for f in findings] == [(3, 3, 1), (3, 3, 1)]
    assert len(filed) == 2
    assert explore.exit_status(findings) == 1


def case_explore_a_finding_whose_reruns_fail_another_way_is_flaky_and_filed_as_such() -> None:
    with tempfile.TemporaryDirectory(prefix="judges-search-") as tmp:
        out = Path(tmp)
        findings = _explore_fake(out, _scenario("A", "x"), _scenario("B"), flaky=True)
        regressions = (out / "regressions.toml").exists()
        flaky = load_suite(str(out / "flaky.toml")).scenarios
    assert [(f.signature, f.reproduced, f.tries, f.flaky) for f in findings] == [
        ({"X"}, 0, 3, True), ({"Y"}, 0, 3, True)]
    assert not regressions and len(flaky) == 2
    assert explore.exit_status(findings) == 0


class _FakeTargetExploration(TargetExploration):
    """The target loop with a scripted target: every run leaks; seeds 1 and 3 also orphan;
    in a rerun, seed 3's scenario only leaks."""

    def _judge(self, scenario: TargetScenario, seed: int, where: Path) -> TargetVerdict:
        problems = ["[leak] left /tmp/x"]
        if seed in (1, 3) and not (seed == 3 and where.name.startswith("repro-")):
            problems.append("[orphan] pid 7 outlived the driver")
        result = SimpleNamespace(violations=problems, outcome="failed")
        return TargetVerdict(cast(Any, result), cast(Any, None), [], problems)


def case_target_explore_files_leak_then_orphans_and_a_leak_rerun_does_not_reproduce() -> None:
    target = cast(Any, SimpleNamespace(name="processpool"))
    with tempfile.TemporaryDirectory(prefix="judges-search-") as tmp:
        ex = _FakeTargetExploration(target, Path(tmp), say=lambda text: None)
        for seed in range(3):
            ex._explore_one(seed, time.monotonic())
        first = list(ex.findings)
        ex.findings.clear()
        for seed in (0, 3):
            ex._explore_one(seed, time.monotonic())
    findings, ex.findings = ex.findings, first
    assert [f.signature for f in ex.findings] == [{"leak"}, {"leak", "orphan"}]
    assert [f.own for f in ex.findings] == [{"leak"}, {"orphan"}]
    assert [(f.reproduced, f.duplicates, f.flaky) for f in ex.findings] == [(3, 1, False),
                                                                           (3, 0, False)]
    assert [(f.reproduced, f.flaky) for f in findings] == [(3, False), (0, True)]
    assert explore.exit_status(findings[1:]) == 0


CASES = [v for k, v in list(globals().items())
         if k.startswith("case_") and callable(v) and v.__module__ == __name__]


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_case(case: Callable[[], None]) -> None:
    case()


@pytest.mark.parametrize("judge", planted_in("search"), ids=lambda j: j.name)
def test_planted_judge_is_caught(judge: PlantedJudge) -> None:
    assert_caught(judge, CASES)
