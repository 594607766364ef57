"""Issue 26 on the chaos targets: the target swarm (a function of its seed, TOML-able),
target histories from real processpool runs checked by chaos.history_check, and a short
``faultlab chaos explore --target processpool`` that files processpool's orphans (its
workers outlive a SIGKILLed driver) as a finding about processpool, with a reproduction."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from chaos import history, history_check
from chaos.suites import load_suite
from chaos.targets import get_target, swarm
from chaos.targets import history as target_history
from chaos.targets.base import FAULT_KINDS, WorkloadSpec
from chaos.targets.explore import SAVED, TargetVerdict, candidates, judge, new_invariants
from chaos.targets.faultlab_target import unit_of_work_values
from chaos.targets.scenario import TargetScenario
from chaos.targets.vllm_target import VllmTarget
from faultlab.cli import main

SPEC = {"calls": 3, "call_s": 0.05, "ranks": 2}


def _judge(tmp_path: Path, name: str, **fields: object) -> TargetVerdict:
    sc = TargetScenario.from_dict({"name": name, "spec": SPEC, "bound_s": 10.0, **fields}, name)
    return judge(get_target("processpool"), sc, 1, tmp_path / name, tmp_path)


# ------------------------------------------------------------------ the target swarm


def test_target_swarm_is_a_function_of_its_seed_and_round_trips_through_toml(tmp_path: Path) -> None:
    drawn = [swarm.draw(seed) for seed in range(60)]
    assert drawn == [swarm.draw(seed) for seed in range(60)]
    assert {sc.fault for sc in drawn} == set(FAULT_KINDS)
    assert len({(sc.fault, sc.after_invoke, sc.at, json.dumps(sc.spec)) for sc in drawn}) > 50
    for sc in drawn:
        spec = sc.workload_spec(0)
        assert sc.after_invoke is None or 1 <= sc.after_invoke <= spec.calls
        assert sc.fault not in ("kill", "term", "stop") or (sc.rank or 0) < spec.ranks
        assert sc.at[0] == sc.at[1]  # a point: the moment never depends on the name
    suite = tmp_path / "s.toml"
    suite.write_text('[suite]\nname = "s"\nseed = 0\n\n'
                     + "\n".join(swarm.scenario_toml(sc) for sc in drawn))
    assert list(load_suite(str(suite)).target_scenarios) == drawn
    other = subprocess.run([sys.executable, "-c", "from chaos.targets import swarm; "
                            "print(repr(swarm.draw(7)))"], capture_output=True, text=True, check=True)
    assert other.stdout.strip() == repr(swarm.draw(7))  # the same in another process
    assert {swarm.draw(s, ("engine_core",)).rank for s in range(20)
            if swarm.draw(s).fault == "kill"} == {None}


def test_shrink_candidates_make_the_fault_earlier_and_the_schedule_smaller() -> None:
    sc = TargetScenario.from_dict({"name": "x", "fault": "kill", "rank": 0, "after_invoke": 4,
                                   "at": 0.03, "spec": {"calls": 6, "ranks": 3}}, "x")
    got = [(c.after_invoke, c.spec["calls"], c.spec["ranks"], c.at) for c in candidates(sc)]
    assert got == [(1, 3, 3, (0.03, 0.03)), (4, 5, 3, (0.03, 0.03)), (4, 6, 1, (0.03, 0.03)),
                   (4, 6, 3, (0.0, 0.0))]
    smallest = TargetScenario.from_dict({"name": "y", "fault": "kill", "rank": 0, "after_invoke": 1,
                                         "spec": {"calls": 1, "ranks": 1}}, "y")
    assert candidates(smallest) == []


def test_a_run_is_a_new_finding_when_it_breaks_an_invariant_no_finding_broke() -> None:
    # Ray leaves its session directory after every run: the orphans of a killed driver
    # must not be counted as that leak seen again.
    leak, orphan = frozenset({"leak"}), frozenset({"leak", "orphan"})
    assert new_invariants(orphan, [leak]) == {"orphan"}
    assert new_invariants(leak, [orphan]) == frozenset() == new_invariants(leak, [leak])
    assert new_invariants(leak, []) == leak


# ------------------------------------------------------------------ target histories


def test_history_of_real_processpool_runs_checks_clean_and_reports_what_it_should(
        tmp_path: Path) -> None:
    clean = _judge(tmp_path, "fault-free")
    assert clean.problems == [] and clean.result.outcome == "ok"
    ops = [e["op"] for e in clean.events]
    assert ops.count("invoke") == 3 and ops.count("ok") == 3
    assert all(e.get("seq") is None for e in clean.events)  # processpool promises no order
    saved = history.read(tmp_path / "fault-free" / history.FILE_NAME)
    assert saved == json.loads(json.dumps(clean.events)) and history_check.check(saved) == []

    killed = _judge(tmp_path, "killed", fault="kill", rank=0, after_invoke=2, at=0.01)
    assert killed.result.outcome == "failed" and killed.problems == []
    outcome = {e["call"]: e for e in killed.events if e["op"] != "invoke"}
    assert outcome[0]["op"] == "ok"
    assert outcome[1]["op"] == "info" and outcome[1]["error"] == "BrokenProcessPool"

    # The same real record, broken on purpose: each check must see it.
    expected = unit_of_work_values(WorkloadSpec(calls=3, call_s=0.05, ranks=2))
    shifted = {i: expected[(i + 1) % 3] for i in expected}  # call 0 "owns" call 1's value ...
    kinds = {v.kind for v in history_check.check(target_history.build(clean.record, shifted))}
    assert kinds == {"reply_to_other"}
    wrong = {i: [0, 0] for i in expected}
    assert {v.kind for v in history_check.check(target_history.build(clean.record, wrong))} == {
        "wrong_value"}
    lost = copy.deepcopy(clean.record)
    lost.calls[2].update(outcome="pending", end_ns=None)
    found = history_check.check(target_history.build(lost, expected))
    assert [(v.kind, v.ops[0]["call"]) for v in found] == [("never_completed", 2)]
    lost.ended_by = "fault"  # a call in flight when the fault SIGKILLed the driver: unknown
    assert history_check.check(target_history.build(lost, expected)) == []


def test_out_of_order_is_judged_only_where_the_target_promises_order(tmp_path: Path) -> None:
    record = _judge(tmp_path, "order").record
    record.calls[0]["end_ns"], record.calls[1]["end_ns"] = (record.calls[1]["end_ns"],
                                                            record.calls[0]["end_ns"])
    expected = unit_of_work_values(WorkloadSpec(calls=3, call_s=0.05, ranks=2))
    assert history_check.check(target_history.build(record, expected)) == []  # processpool
    record.target = "faultlab"  # its futures complete in submission order
    kinds = [v.kind for v in history_check.check(target_history.build(record, expected))]
    assert kinds == ["out_of_order"]


def test_replay_reruns_a_target_run_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _judge(tmp_path, "fault-free")
    assert (tmp_path / "fault-free" / SAVED).is_file()
    assert main(["chaos", "replay", str(tmp_path / "fault-free"), "--out", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert "replayed fault-free on processpool" in out and "the same invariants" in out
    assert (tmp_path / "r" / history.FILE_NAME).is_file()


# ------------------------------------------------------------------ the command


def test_explore_target_processpool_files_its_orphans_with_a_reproduction(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "x"
    # Seed 1 draws a SIGKILL of the driver while its workers idle (after done).
    assert swarm.draw(1).fault == "kill_driver" and not swarm.draw(1).busy
    code = main(["chaos", "explore", "--target", "processpool", "--budget", "3s", "--seed", "1",
                 "--max-findings", "1", "--shrink-runs", "0", "--reproductions", "1",
                 "--out", str(out)])
    text = capsys.readouterr().out
    assert code == 1
    report = json.loads((out / "explore.json").read_text())
    assert report["target"] == "processpool" and report["runs"] == 1
    [finding] = report["findings"]
    assert finding["about"] == "processpool" and "orphan" in finding["signature"]
    assert (finding["reproduced"], finding["tries"]) == (1, 1)
    assert f"Reproduce with: faultlab chaos replay {finding['run_dir']}" in text
    assert (Path(finding["run_dir"]) / SAVED).is_file()
    [filed] = load_suite(str(out / "regressions.toml")).target_scenarios
    assert filed.to_dict() == finding["scenario"] and filed.fault == "kill_driver"
    case = ET.parse(out / "junit.xml").getroot().find("testsuite/testcase")
    assert case is not None and case.get("classname") == "chaos.explore.processpool"
    assert case.find("failure") is not None
    coverage = json.loads((out / "coverage.json").read_text())
    assert coverage["cells"] == [{"fault": "kill_driver", "whom": "driver, workers idle",
                                  "outcome": "orphans", "runs": 1}]
    assert (out / "scenarios" / "tswarm-1" / history.FILE_NAME).is_file()
    own = Path(__file__).parents[2] / "chaos" / "suites" / "regressions.toml"
    assert not own.exists() or "tswarm-" not in own.read_text()  # faultlab's own suite


@pytest.mark.parametrize(("argv", "words"), [
    (["--target", "nope"], "unknown target; known: faultlab"),
    (["--target", "loky", "--mutant", "SkipsChecksum"], "goes with --target faultlab"),
    (["--target", "vllm"], "install_vllm_target.sh"),
])
def test_explore_target_usage_errors_are_one_line_exit_2(
        argv: list[str], words: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("FAULTLAB_VLLM_PYTHON", str(tmp_path / "no-such-python"))
    assert VllmTarget().unavailable() is not None
    code = main(["chaos", "explore", "--budget", "1s", "--out", str(tmp_path / "o"), *argv])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and words in err, err
    assert not (tmp_path / "o" / "explore.json").exists()
