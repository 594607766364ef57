"""The swarm's recovery family (chaos.swarm_recovery) and the second fault that interrupts a
recovery (chaos.interrupted_recovery):

    case                                        expected
    a seed's recovery draw                      the same scenario every time; ~1 in 10 seeds
    kill, then kill a new worker before it      recovered, fault-free tokens, both faults fired,
      goes live (the real executor)             the restart retried (no dead worker serves)
    the same on MissesEarlyRestartDeath         [restart]: the killed worker serves
    kill, then kill during the replay           two recoveries, fault-free tokens
    replay of a saved recovery run              reruns it: the same violation, the same faults
    kill; the restart loads a changed           recovered; kept tokens kept, every differing
      checkpoint (skew), the real Recovery      rebuilt token counted
    the same on CountsNoMismatch                [mismatches]: differing tokens went uncounted
    the same on KeepsRebuiltToken               [tokens]: a kept token changed
    a finding's shrink and its regressions row  the second fault dropped; a [[recovery]] table
                                                chaos run loads back
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chaos import skewed_restart, swarm_recovery
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


def test_a_restart_that_misses_the_death_is_caught_and_replayed(tmp_path: Path,
                                                                capfd: pytest.CaptureFixture[str]) -> None:
    result = run_recovery(interrupted("before_live", MUTANT), 3, tmp_path)
    problems = [str(v) for v in result.violations]
    assert any(p.startswith("[restart]") and "serves after the restart" in p for p in problems), \
        problems
    assert main(["chaos", "replay", str(tmp_path)]) == 1
    out = capfd.readouterr().out
    assert "serves after the restart" in out and "the faults that fired are the same as" in out


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
