"""The swarm's recovery family (chaos.swarm_recovery) and the second fault that interrupts a
recovery (chaos.interrupted_recovery):

    case                                        expected
    a seed's recovery draw                      the same scenario every time; ~1 in 10 seeds
    kill, then kill a new worker before it      recovered, fault-free tokens, both faults fired,
      goes live (the real executor)             the restart retried (no dead worker serves)
    kill, then kill during the replay           two recoveries, fault-free tokens
    kill; the restart loads a changed           recovered; kept tokens kept, every differing
      checkpoint (skew), the real Recovery      rebuilt token counted
    the same on CountsNoMismatch                [mismatches]: differing tokens went uncounted
    the same on KeepsRebuiltToken               [tokens]: a kept token changed
    a finding's shrink and its regressions row  the second fault dropped; a [[recovery]] table
                                                chaos run loads back
    explore from seed 78 at                     found at seed 78 (corrupt, then before_live):
      MissesEarlyRestartDeath                   [restart]: the killed worker serves; the shrink
                                                keeps both faults; reproduced; "recovery itself
                                                was interrupted" reached; replay of the filed
                                                run: the same violation, the same faults
    explore from seed 120 at KeepsRebuiltToken  plain seeds skipped; found at 122 (skew)
    a caller whose stderr has no fd (capsys)    a model worker still starts
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chaos import skewed_restart, swarm_recovery
from chaos.coverage import INTERRUPTED
from chaos.explore import Exploration, Limits
from chaos.faults import PlanError
from chaos.recovery import RecoveryScenario, run_recovery
from chaos.regressions import append_scenario
from chaos.suites import load_suite
from faultlab.cli import main

MUTANT = "chaos.mutants:MissesEarlyRestartDeath"
SMALL = {"steps": (2, 4), "requests": 3, "max_tokens": 10, "step_timeout": 5.0,
         "recovery_bound_s": 30.0}


def interrupted(then: str, executor: str = "", rank: int = 1) -> RecoveryScenario:
    return RecoveryScenario(f"then-{then}", fault="kill", rank=1, then=then, then_rank=rank,
                            executor=executor, **SMALL)  # type: ignore[arg-type]


def test_a_seeds_recovery_draw_is_the_same_every_time() -> None:
    draws = [swarm_recovery.draw(seed) for seed in range(300)]
    assert draws == [swarm_recovery.draw(seed) for seed in range(300)]
    drawn = [d for d in draws if d is not None]
    assert 10 <= len(drawn) <= 60, f"{len(drawn)} of 300 seeds drew the recovery family"
    assert {d.then for d in drawn} == {"", "before_live", "in_replay"} and any(d.skew for d in drawn)
    for d in drawn:
        d.check(d.name)


def test_a_new_worker_killed_before_going_live_is_replaced(tmp_path: Path) -> None:
    result = run_recovery(interrupted("before_live", rank=0), 3, tmp_path)
    assert result.ok, result.violations
    assert result.recovered and result.requests_lost == 0
    [_, second] = result.faults
    assert second["then"] == "before_live" and second["during"] == "before_go_live"
    assert swarm_recovery.interrupted(result)


def test_a_kill_during_the_replay_costs_a_second_recovery(tmp_path: Path) -> None:
    result = run_recovery(interrupted("in_replay", rank=0), 3, tmp_path)
    assert result.ok, result.violations
    assert result.faults[1]["during"] == "replay"
    saved = json.loads((tmp_path / "result.json").read_text())
    assert saved["recovered"] and saved["requests_lost"] == 0


@pytest.mark.parametrize("recovery, caught", [
    ("", None),
    ("chaos.mutants:CountsNoMismatch", "[mismatches]"),
    ("chaos.mutants:KeepsRebuiltToken", "a kept token changed"),
], ids=["real", "CountsNoMismatch", "KeepsRebuiltToken"])
def test_a_skewed_restart_keeps_and_counts_rebuilt_tokens(tmp_path: Path, recovery: str,
                                                          caught: str | None) -> None:
    scenario = RecoveryScenario("skew", fault="kill", rank=1, skew=True, recovery=recovery,
                                **SMALL)  # type: ignore[arg-type]
    result = run_recovery(scenario, 3, tmp_path)
    problems = [str(v) for v in result.violations]
    assert skewed_restart.sampled(tmp_path / "skew-flag"), "the new incarnation never skewed"
    if caught is None:
        assert result.ok and result.recovered and result.tokens_recomputed > 0, problems
        again = run_recovery(scenario, 3, tmp_path)  # the same directory: a fresh log
        assert again.ok, again.violations
    else:
        assert any(caught in p for p in problems), problems


def test_a_finding_shrinks_to_its_first_fault_and_is_filed(tmp_path: Path) -> None:
    scenario = interrupted("before_live", MUTANT)
    [shrunk] = swarm_recovery.candidates(scenario)
    assert shrunk.then == "" and shrunk.fault == scenario.fault and shrunk.rank == scenario.rank
    assert swarm_recovery.candidates(shrunk) == []
    assert (swarm_recovery.schedule_length(scenario), swarm_recovery.schedule_length(shrunk)) == (2, 1)
    path = tmp_path / "regressions.toml"
    assert append_scenario(path, scenario, "found") and not append_scenario(path, scenario, "again")
    assert load_suite(str(path)).recovery == (scenario,)


@pytest.mark.parametrize("table, message", [
    ({"then": "mid_air"}, "then: must be one of"),
    ({"then": "before_live", "policy": "fail_stop"}, "needs policy 'restart'"),
    ({"then": "before_live", "then_rank": 2}, "then_rank: 2 is not a rank"),
    ({"executor": "nocolon"}, "must be 'module:Class'"),
    ({"skew": True, "async_scheduling": True}, "skew: needs fault 'kill'"),
    ({"skew": True, "fault": "hang"}, "skew: needs fault 'kill'"),
])
def test_a_bad_second_fault_is_a_plan_error(table: dict[str, object], message: str) -> None:
    with pytest.raises(PlanError, match=message):
        RecoveryScenario.from_dict({"name": "x", **table}, "recovery[0]")


def aimed(tmp_path: Path, mutant: str, seed: int, shrink_runs: int) -> Exploration:
    exploration = Exploration(tmp_path, f"chaos.mutants:{mutant}", seed,
                              Limits(shrink_runs=shrink_runs, reproductions=1), say=lambda _: None,
                              max_findings=1)
    exploration.run(60.0)
    return exploration


def test_explore_finds_a_restart_that_misses_an_early_death(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    drawn = swarm_recovery.draw(78)
    assert drawn is not None and drawn.then == "before_live", drawn
    exploration = aimed(tmp_path, "MissesEarlyRestartDeath", 78, shrink_runs=1)
    [finding] = exploration.findings
    assert (finding.seed, finding.name, finding.reproduced) == (78, "restart", 1)
    assert exploration.runs == 1 and exploration.coverage.sometimes[INTERRUPTED] == 1
    assert finding.schedule_length(finding.shrunk) == 2  # without the second fault it passes
    saved = json.loads((tmp_path / "scenarios" / "recovery-78" / "swarm.json").read_text())
    assert saved["family"] == "recovery" and saved["recovery"]["then"] == "before_live"
    [filed] = load_suite(str(tmp_path / "regressions.toml")).recovery
    assert filed.then == "before_live" and filed.steps[0] == filed.steps[1]  # the step pinned
    capfd.readouterr()
    assert main(["chaos", "replay", str(finding.run_dir), "--out", str(tmp_path / "again")]) == 1
    out = capfd.readouterr().out
    assert "serves after the restart" in out and "the faults that fired are the same as" in out


def test_explore_aimed_at_a_planted_recovery_runs_recovery_seeds_only(tmp_path: Path) -> None:
    exploration = aimed(tmp_path, "KeepsRebuiltToken", 120, shrink_runs=0)
    [finding] = exploration.findings
    assert finding.seed == 122 and finding.name == "tokens" and finding.reproduced == 1
    assert exploration.skipped == 2 and exploration.runs == 1  # seeds 120, 121: plain


def test_a_model_worker_starts_when_the_callers_stderr_has_no_fd(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Under capsys (as in a notebook) sys.stderr has no fileno: the recovery family's model
    workers failed to start there, and an explore run in such a process filed that."""
    from executor import ExecutorConfig, MultiprocExecutor

    cfg = ExecutorConfig(worker="executor.model.worker:ModelWorker", start_method="fork",
                         worker_kwargs={"seed": 1})
    with MultiprocExecutor(cfg) as ex:
        assert ex.collective_rpc("num_cached_requests", timeout=30) == [0]
