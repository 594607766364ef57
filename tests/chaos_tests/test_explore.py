"""Issue 26: the history checker on hand-made histories (one per violation class), swarm
determinism from the seed, histories of a real run, and a short ``faultlab chaos explore``
that finds a planted mutant, shrinks it and writes a regression that reproduces it."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from chaos import history, history_check, swarm, swarm_recovery
from chaos.explore import candidates, judge
from chaos.faults import KillWorker
from chaos.regressions import scenario_toml
from chaos.runner import run_one
from chaos.suites import Scenario, load_suite
from chaos.workloads import CallSpec
from faultlab.cli import main


def _invoke(i: int, expected: str | None, method: str = "echo") -> dict[str, Any]:
    return {"op": "invoke", "call": i, "t": 10 * i, "method": method, "args": f"({expected},)",
            "non_block": True, "timeout": 1.0, "expected": expected}


def _done(i: int, op: str, seq: int, t: int, **kw: Any) -> dict[str, Any]:
    return {"op": op, "call": i, "t": t, "seq": seq, **kw}


def _exec(i: int, rank: int, t: int, incarnation: int = 0, replay: bool = False) -> dict[str, Any]:
    return {"op": "exec_start", "call": i, "t": t, "rank": rank, "pid": 100 + rank,
            "incarnation": incarnation, "replay": replay, "rpc_id": i + 1}


CLEAN = [_invoke(0, "'a'"), _invoke(1, "'b'"), _exec(0, 0, 11), _exec(1, 0, 12),
         _exec(1, 0, 13, incarnation=1, replay=True),  # a recovery replay: expected
         _done(0, "ok", 0, 20, value="'a'"), _done(1, "info", 1, 30, error="TimeoutError")]

# (violation class, the history, the calls its minimal ops must name)
BROKEN = [
    ("never_completed", [_invoke(0, "'a'"), _invoke(1, "'b'"), _done(0, "ok", 0, 20, value="'a'")], {1}),
    ("wrong_value", [_invoke(0, "'a'"), _done(0, "ok", 0, 20, value="'garbage'")], {0}),
    ("reply_to_other", [_invoke(0, "'a'"), _invoke(1, "'b'"), _done(0, "ok", 0, 20, value="'a'"),
                        _done(1, "ok", 1, 30, value="'a'")], {0, 1}),
    ("out_of_order", [_invoke(0, "'a'"), _invoke(1, "'b'"), _done(1, "ok", 0, 20, value="'b'"),
                      _done(0, "ok", 1, 30, value="'a'")], {0, 1}),
    ("executed_twice", [_invoke(0, "'a'"), _exec(0, 1, 11), _exec(0, 1, 12),
                        _done(0, "ok", 0, 20, value="'a'")], {0}),
    ("executed_after_fail", [_invoke(0, "'a'"), _done(0, "fail", 0, 5, error="QueueFullError"),
                             _exec(0, 0, 11)], {0}),
]


def test_a_clean_history_with_a_marked_replay_has_no_violation() -> None:
    assert history_check.check(CLEAN) == []
    assert history_check.replays(CLEAN) == 1


@pytest.mark.parametrize(("kind", "events", "calls"), BROKEN, ids=[b[0] for b in BROKEN])
def test_each_violation_class_is_named_with_its_minimal_ops(kind: str, events: list[dict[str, Any]],
                                                              calls: set[int]) -> None:
    found = history_check.check(events)
    assert [v.kind for v in found] == [kind], found
    assert {op["call"] for op in found[0].ops} == calls
    assert len(found[0].ops) < len(events) or len(events) <= 4  # a subset, not the history


def test_a_deadline_or_an_unmarked_replay_changes_the_verdict() -> None:
    """A timed-out call may be overtaken; a second run in a new incarnation not marked as a
    replay is still one run per incarnation (no violation), marked or not."""
    late = [_invoke(0, "'a'"), _invoke(1, "'b'"), _done(1, "ok", 0, 20, value="'b'"),
            _done(0, "info", 1, 30, error="TimeoutError")]
    assert history_check.check(late) == []
    twice_same_life = [*CLEAN[:4], _exec(1, 0, 13), *CLEAN[5:]]
    assert [v.kind for v in history_check.check(twice_same_life)] == ["executed_twice"]


def test_calls_of_the_callbacks_workloads_may_complete_out_of_order() -> None:
    """A call made inside a done-callback completes inside another's completion."""
    events = [_invoke(0, "'a'"), {**_invoke(1, "'b'"), "check": "callbacks"},
              _done(1, "ok", 0, 20, value="'b'"), _done(0, "ok", 1, 30, value="'a'")]
    assert history_check.check(events) == []
    del events[1]["check"]
    assert [v.kind for v in history_check.check(events)] == ["out_of_order"]


def test_a_history_file_round_trips_and_a_bad_line_is_named(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    history.write(path, CLEAN)
    assert history.read(path) == CLEAN
    path.write_text(path.read_text() + "not json\n")
    with pytest.raises(ValueError, match=r"history.jsonl:8: not a JSON history event"):
        history.read(path)


def test_the_swarm_is_a_function_of_its_seed() -> None:
    drawn = [swarm.draw(s).to_dict() for s in range(30)]
    assert drawn == [swarm.draw(s).to_dict() for s in range(30)]
    assert len({json.dumps(d, sort_keys=True) for d in drawn}) == 30
    code = ("import json; from chaos import swarm; "
            "print(json.dumps([swarm.draw(s).to_dict() for s in range(30)], sort_keys=True))")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": "12345", "PATH": ""}, cwd=Path(__file__).parents[2])
    assert json.loads(other.stdout) == json.loads(json.dumps(drawn, sort_keys=True))
    active = sum(len(d["active"]) for d in drawn) / (30 * len(swarm.SITES))
    assert 0.15 < active < 0.35  # about ACTIVE_P of the sites are on per run


def test_a_swarm_scenario_survives_the_toml_round_trip(tmp_path: Path) -> None:
    scenario = swarm.draw(7).scenario("chaos.mutants:WrongResults")
    path = tmp_path / "s.toml"
    path.write_text('[suite]\nname = "x"\n' + scenario_toml(scenario))
    assert load_suite(str(path)).scenarios[0].to_dict() == scenario.to_dict()


def test_shrinking_a_call_away_keeps_each_on_call_fault_on_the_call_it_hit() -> None:
    calls = (CallSpec("sleep", (0.1,), 2.0), CallSpec("echo", ("x",), 2.0),
             CallSpec("sleep", (30.0,), 40.0))
    faults = (KillWorker(rank=1, on_call=("sleep", 2)), KillWorker(rank=0, on_call=("*", 3)),
              KillWorker(rank=0, on_call=("echo", 1)))
    scenario = Scenario("s", {"tensor_parallel_size": 2}, faults, calls=calls)
    shrunk = {tuple(c.args for c in cand.calls): [f.on_call for f in cand.faults]
              for cand in candidates(scenario, 0) if len(cand.calls) == 2}
    assert shrunk[(("x",), (30.0,))] == [("sleep", 1), ("*", 2), ("echo", 1)]
    assert shrunk[((0.1,), (30.0,))] == [("sleep", 2), ("*", 2), ("echo", 1)]  # echo's own: the next
    assert shrunk[((0.1,), ("x",))] == [("sleep", 2), ("*", 3), ("echo", 1)]


def test_shrinking_drops_runs_of_calls_halves_first_never_all() -> None:
    calls = tuple(CallSpec("echo", (f"c{i}",), 2.0) for i in range(8))
    kept = [[c.args[0] for c in cand.calls]
            for cand in candidates(Scenario("s", {}, (), calls=calls), 0)]
    assert kept[:2] == [["c0", "c1", "c2", "c3"], ["c4", "c5", "c6", "c7"]]
    assert all(0 < len(k) < 8 for k in kept) and len(kept) == 2 + 4 + 8


def test_a_forkserver_run_whose_install_call_fails_is_a_finding_not_a_crash(tmp_path: Path) -> None:
    """SkipsChecksum's driver writes checksum 0; forkserver workers (fresh imports) check the
    real one, so the first call, which installs the failpoints, fails: explore goes on."""
    scenario = Scenario("i", {"tensor_parallel_size": 2, "start_method": "forkserver"}, (),
                        calls=(CallSpec("echo", ("x",), 2.0),), executor="chaos.mutants:SkipsChecksum")
    verdict = judge(scenario, 0, tmp_path)
    assert verdict.signature == {"startup"}, verdict.problems
    assert "damaged" in verdict.problems[0]


def test_a_real_run_history_maps_each_execution_to_its_call(tmp_path: Path) -> None:
    calls = (CallSpec("echo", ("one",), 2.0), CallSpec("echo", ("two",), 2.0, True),
             CallSpec("get_rank", (), 2.0, False, 1))
    scenario = Scenario("h", {"tensor_parallel_size": 2, "start_method": "fork"}, (), calls=calls)
    result = run_one(scenario, 0, tmp_path)
    events = history.build(result.calls, result.trace_dir)
    starts = sorted((e["call"], e["rank"]) for e in events if e["op"] == "exec_start")
    assert starts == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]
    assert [e["op"] for e in events if e["op"] in ("ok", "fail", "info")] == ["ok"] * 3
    assert history_check.check(events) == []


def _plain_echoes(drawn: swarm.Swarm) -> bool:
    """Plain calls (no other surrounding's own finding first), a blocking echo among them,
    no Ctrl-C (a KeyboardInterrupt the workload lets escape ends it, maybe before the echo)."""
    return drawn.surrounding == "calls" and len(drawn.calls) > 2 and any(
        c.method == "echo" and not c.non_block for c in drawn.calls) and not any(
        f.kind == "interrupt_driver" for f in drawn.faults)


def test_explore_finds_a_planted_mutant_and_files_a_reproducible_regression(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "ex"
    seed = next(s for s in range(100) if _plain_echoes(swarm.draw(s))  # more to shrink than 2 steps
                and swarm_recovery.draw(s) is None)  # a plain seed (a recovery one has no history)
    code = main(["chaos", "explore", "--budget", "4s", "--mutant", "WrongResults", "--out", str(out),
                 "--shrink-runs", "12", "--reproductions", "2", "--seed", str(seed),
                 "--max-findings", "1"])
    captured = capsys.readouterr()
    assert code == 1, captured
    report = json.loads((out / "explore.json").read_text())
    [finding] = report["findings"]
    assert "results" in finding["signature"] or "history.wrong_value" in finding["signature"]
    assert finding["reproduced"] == 2 and not finding["flaky"]
    assert finding["schedule_length"] <= 2 < finding["original_length"]
    assert "Reproduce with: faultlab chaos replay" in captured.out
    [regression] = load_suite(str(out / "regressions.toml")).scenarios
    assert regression.executor == "chaos.mutants:WrongResults"
    junit = ET.parse(out / "junit.xml").getroot().find("testsuite")
    assert junit is not None and junit.get("failures") == "1"
    assert (out / "coverage.md").read_text().startswith("# Coverage of")
    scenario_dirs = list((out / "scenarios").iterdir())
    assert scenario_dirs and all((d / "history.jsonl").is_file() for d in scenario_dirs)
    assert main(["chaos", "replay", finding["run_dir"], "--out", str(tmp_path / "again")]) == 1


@pytest.mark.parametrize(("argv", "message"), [
    (["--budget", "soon"], "a duration is a positive number"),
    (["--budget", "0s"], "a duration is a positive number"),
    (["--budget", "1s", "--mutant", "NoSuchBug"], "no executor mutant 'NoSuchBug'"),
    (["--budget", "1s", "--target", "nope"], "unknown target; known: faultlab"),
    (["--budget", "1s", "--target", "ray", "--mutant", "SkipsChecksum"],
     "goes with --target faultlab"),
])
def test_explore_usage_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                     argv: list[str], message: str) -> None:
    try:
        code = main(["chaos", "explore", *argv, "--out", str(tmp_path / "o")])
    except SystemExit as exc:  # argparse's own usage errors
        code = exc.code  # type: ignore[assignment]
    assert code == 2
    assert message in capsys.readouterr().err


def test_chaos_run_replays_the_regressions_first(tmp_path: Path) -> None:
    from chaos.regressions import append_scenario, with_regressions

    regressions = tmp_path / "regressions.toml"
    found = swarm.draw(3).scenario()
    assert append_scenario(regressions, found, "a note\nof two lines")
    assert not append_scenario(regressions, found, "again")  # filed once
    suite = load_suite("smoke")
    combined = with_regressions(suite, regressions)
    assert [s.name for s in combined.scenarios] == [found.name, *(s.name for s in suite.scenarios)]
    assert with_regressions(suite, tmp_path / "none.toml") is suite
    assert with_regressions(load_suite(str(regressions)), regressions).scenarios == (
        load_suite(str(regressions)).scenarios)
