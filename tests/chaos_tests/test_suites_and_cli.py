"""Suites load (and malformed ones name the file and key), plans are deterministic, and
``faultlab chaos run`` / ``replay`` work end to end."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from cli_errors import one_line_error

from chaos import FaultPlan, KillWorker, PlanError, SlowWorker, schedule_signature
from chaos.faults import KINDS
from chaos.plan import timeline_signature
from chaos.suites import SuiteError, load_suite
from faultlab.cli import main

GOOD = """
[suite]
name = "tiny"
seed = 3
[suite.config]
start_method = "fork"
[[scenario]]
name = "slow"
calls = [{method = "echo", args = [1], timeout = 2.0, repeat = 3}]
[[scenario.faults]]
kind = "slow_worker"
rank = 1
probability = 0.5
delay = 0.01
[[scenario]]
name = "kill"
[[scenario.faults]]
kind = "kill_worker"
rank = 0
on_call = ["sleep", 1]
"""


def test_builtin_suites_cover_every_fault_kind():
    smoke = load_suite("smoke")
    assert len(smoke.scenarios) >= 10
    assert {f.kind for s in smoke.scenarios for f in s.faults} == set(KINDS)
    assert len(load_suite("full").scenarios) > len(smoke.scenarios)


@pytest.mark.parametrize(("text", "where"), [
    ("[[scenario]]\nname = 'a'\n[[scenario.faults]]\nkind = 'explode'\n", "scenario[0].faults[0].kind"),
    ("[[scenario]]\nname = 'a'\n[[scenario.faults]]\nkind = 'kill_worker'\nrnak = 1\n", "scenario[0].faults[0].rnak"),
    ("[[scenario]]\nname = 'a'\n[[scenario.faults]]\nkind = 'kill_worker'\non_call = ['x', 0]\n", "scenario[0].faults[0]"),
    ("[[scenario]]\nname = 'a'\nexpect = 'maybe'\n", "scenario[0].expect"),
    ("[[scenario]]\nname = 'a'\n[scenario.config]\ntensor_parallel_size = 0\n", "scenario[0].config"),
    ("[[scenario]]\nname = 'a'\n[scenario.config]\ncolour = 'red'\n", "scenario[0].config.colour"),
    ("[[scenario]]\nworkload = 'standard'\n", "scenario[0].name"),
    ("[[scenario]]\nname = 'a'\ncalls = [{method = 'echo', bogus = 1}]\n", "scenario[0].calls[0].bogus"),
    ("[suite]\nseed = 'x'\n[[scenario]]\nname = 'a'\n", "suite.seed"),
    ("[suite]\nname = 'x'\n", "scenario"),
    ("[[scenario]]\nname = 'a'\n[[scenario]]\nname = 'a'\n", "duplicate"),
    ("not toml = = =", "not valid TOML"),
    ("[[scenario]]\nname = 'a'\n[[scenario.faults]]\nkind = 'kill_worker'\nat = [5.0, 0.1]\n",
     "scenario[0].faults[0].at: a time range is [low, high] with low <= high, got [5.0, 0.1]"),
    ("[[scenario]]\nname = 'a'\n[[scenario.faults]]\nkind = 'kill_worker'\nat = [0.1, 0.2, 0.3]\n",
     "scenario[0].faults[0]: kill_worker: at must be seconds >= 0 or a [low, high] range"),
    ("[[scenario]]\nname = 'a'\n[[scenario.faults]]\nkind = 'kill_worker'\nmay_not_fire = 'yes'\n",
     "scenario[0].faults[0].may_not_fire: must be true or false"),
])
def test_malformed_suite_names_file_and_key(tmp_path, text, where):
    path = tmp_path / "bad_suite.toml"
    path.write_text(text)
    with pytest.raises(SuiteError) as info:
        load_suite(str(path))
    assert "bad_suite.toml" in str(info.value) and where in str(info.value)


def test_missing_suite_lists_the_builtin_ones():
    with pytest.raises(SuiteError, match="smoke"):
        load_suite("no-such-suite")


def test_same_seed_same_schedule_other_seed_other_schedule():
    faults = [SlowWorker(rank=1, probability=0.2), KillWorker(rank=0, at=[0.1, 2.0])]
    one, two = FaultPlan(faults, seed=11), FaultPlan(faults, seed=11)
    assert schedule_signature(one.resolve()) == schedule_signature(two.resolve())
    assert schedule_signature(one.resolve()) != schedule_signature(one.with_seed(12).resolve())
    assert FaultPlan.from_dict(json.loads(one.dumps())) == one


def test_plan_errors_name_the_field():
    with pytest.raises(PlanError, match="one trigger"):
        KillWorker(at=1.0, on_call=("echo", 1))
    with pytest.raises(PlanError, match="phase"):
        KillWorker(phase="sometime")


def test_run_junit_and_replay_reproduce_the_timeline(tmp_path, capsys):
    suite = tmp_path / "tiny.toml"
    suite.write_text(GOOD)
    out, junit = tmp_path / "out", tmp_path / "junit.xml"
    code = main(["chaos", "run", str(suite), "--seed", "4", "--out", str(out), "--junit", str(junit)])
    text = capsys.readouterr()
    assert "slow" in text.out and "[1/2]" in text.err
    cases = ET.parse(junit).getroot().findall(".//testcase")
    assert [c.get("name") for c in cases] == ["slow", "kill"]
    assert code == (1 if any(c.find("failure") is not None for c in cases) else 0)
    for name in ("slow", "kill"):
        assert (out / name / "plan.json").exists() and (out / name / "trace").is_dir()
    original = json.loads((out / "slow" / "result.json").read_text())
    assert original["seed"] == 4 and original["faults"]
    main(["chaos", "replay", str(out / "slow")])
    assert "is the same as the original" in capsys.readouterr().out
    replayed = json.loads((out / "slow" / "replay" / "result.json").read_text())
    assert timeline_signature(replayed["faults"]) == timeline_signature(original["faults"])


def test_malformed_suite_exits_2(tmp_path, capsys):
    path = tmp_path / "broken.toml"
    path.write_text("[[scenario]]\nname = 'a'\nexpect = 'maybe'\n")
    assert main(["chaos", "run", str(path), "--out", str(tmp_path / "o")]) == 2
    assert "broken.toml: scenario[0].expect" in capsys.readouterr().err


def test_strategies_draw_valid_plans_deterministically():
    from hypothesis import given, settings

    from chaos.strategies import call_specs, fault_plans

    @settings(max_examples=30, deadline=None)
    @given(fault_plans(), call_specs())
    def check(plan, spec):
        assert schedule_signature(plan.resolve()) == schedule_signature(plan.resolve())
        assert FaultPlan.from_dict(plan.to_dict()) == plan
        assert spec.method in ("echo", "sleep", "get_rank")

    check()


ROOT = Path(__file__).resolve().parents[2]
FAR = """
[suite]
name = "far"
[[scenario]]
name = "fine"
[[scenario]]
name = "kill-far"
[[scenario.faults]]
kind = "kill_worker"
rank = {rank}
[scenario.config]
tensor_parallel_size = {tp}
pipeline_parallel_size = {pp}
"""


def _usage_error(*args: str) -> str:
    """Run ``faultlab`` as a subprocess; assert exit 2 and one stderr line; return that line."""
    done = subprocess.run([sys.executable, "-m", "faultlab.cli", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


def test_k_matching_no_scenario_is_a_usage_error(tmp_path):
    line = _usage_error("chaos", "run", "smoke", "-k", "no-such-scenario", "--out", str(tmp_path / "o"))
    assert "'no-such-scenario' matches no scenario of suite smoke" in line
    assert "kill-mid-call" in line  # it lists what there is
    assert not (tmp_path / "o").exists()


def test_k_bad_regex_is_a_usage_error(tmp_path):
    line = _usage_error("chaos", "run", "smoke", "-k", "kill(", "--out", str(tmp_path / "o"))
    assert "-k: not a valid regular expression 'kill('" in line


def test_out_naming_a_file_is_a_usage_error(tmp_path):
    (tmp_path / "results").write_text("keep me")
    line = _usage_error("chaos", "run", "smoke", "--out", str(tmp_path / "results"))
    assert "results exists and is not a directory" in line
    assert (tmp_path / "results").read_text() == "keep me"


def test_junit_naming_a_directory_is_a_usage_error(tmp_path):
    line = _usage_error("chaos", "run", "smoke", "--out", str(tmp_path / "o"), "--junit", str(tmp_path))
    assert "--junit" in line and "is a directory" in line


@pytest.mark.parametrize(("tp", "pp", "rank", "valid"), [
    (2, 1, 7, "0..1"), (2, 1, 2, "0..1"), (1, 2, 2, "0..1"), (2, 2, 4, "0..3"),
])
def test_fault_on_a_rank_outside_the_world_is_rejected_at_load(tmp_path, tp, pp, rank, valid):
    path = tmp_path / "far.toml"
    path.write_text(FAR.format(rank=rank, tp=tp, pp=pp))
    with pytest.raises(SuiteError) as info:
        load_suite(str(path))
    message = str(info.value)
    for needle in ("far.toml", "scenario[1].faults[0].rank", "'kill-far'", "kill_worker",
                   f"rank {rank}", f"valid ranks are {valid}"):
        assert needle in message
    line = _usage_error("chaos", "run", str(path), "--out", str(tmp_path / "o"))
    assert f"valid ranks are {valid}" in line and not (tmp_path / "o").exists()


def test_fault_on_the_last_rank_is_accepted(tmp_path):
    path = tmp_path / "far.toml"
    path.write_text(FAR.format(rank=3, tp=2, pp=2))
    assert load_suite(str(path)).scenarios[1].faults[0].rank == 3


def test_plan_check_world_names_the_fault():
    plan = FaultPlan([SlowWorker(rank=1), KillWorker(rank=5)])
    plan.check_world(6)
    with pytest.raises(PlanError, match=r"faults\[1\]\.rank: kill_worker targets rank 5.*0\.\.3"):
        plan.check_world(4)


def test_replay_of_a_malformed_scenario_is_a_usage_error(tmp_path):
    (tmp_path / "scenario.json").write_text(json.dumps({"seed": 1, "scenario": {"name": "x", "bad": 1}}))
    line = _usage_error("chaos", "replay", str(tmp_path))
    assert "scenario.json is not a saved scenario" in line and "bad" in line
    assert "not found" in _usage_error("chaos", "replay", str(tmp_path / "nowhere"))


# ---------------------------------------------------------------- one-line errors, in process

_one_line_error = one_line_error  # faultlab ARGV: exit 2, one stderr line (tests/cli_errors.py)


def test_suite_that_is_not_utf8_is_one_line_error(tmp_path, capsys):
    path = tmp_path / "latin1.toml"
    path.write_bytes("[suite]\nname = 'caf\u00e9'\n[[scenario]]\nname = 'a'\n".encode("latin-1"))
    line = _one_line_error(capsys, "chaos", "run", str(path), "--out", str(tmp_path / "o"))
    assert "latin1.toml: not UTF-8 text" in line and "byte 19" in line
    assert not (tmp_path / "o").exists()


def test_time_range_low_above_high_is_one_line_error(tmp_path, capsys):
    path = tmp_path / "backwards.toml"
    path.write_text("[[scenario]]\nname = 'a'\n[[scenario.faults]]\nkind = 'kill_worker'\n"
                    "at = [5.0, 0.1]\n")
    line = _one_line_error(capsys, "chaos", "run", str(path), "--out", str(tmp_path / "o"))
    assert "backwards.toml: scenario[0].faults[0].at" in line and "low <= high" in line


def _read_only_file(tmp_path: Path) -> str:
    path = tmp_path / "read-only.xml"
    path.write_text("keep me")
    path.chmod(0o444)
    return str(path)


UNWRITABLE = [
    pytest.param(_read_only_file, "it is read-only (mode 0444)", id="read-only-file"),
    pytest.param(lambda tmp: "/proc/version", "it is read-only", id="proc-version"),
    pytest.param(lambda tmp: str(tmp / "a-file" / "junit.xml"), "a-file is not a directory",
                 id="under-a-file"),
    pytest.param(lambda tmp: "/proc/faultlab-none/junit.xml", "nothing can be created in /proc",
                 id="under-proc"),
]


@pytest.mark.parametrize(("make_path", "why"), UNWRITABLE)
def test_junit_to_unwritable_path_is_one_line_error_before_any_scenario(tmp_path, capsys,
                                                                         make_path, why):
    (tmp_path / "a-file").write_text("a file, not a directory")
    junit = make_path(tmp_path)
    line = _one_line_error(capsys, "chaos", "run", "smoke", "--out", str(tmp_path / "o"),
                           "--junit", junit)
    assert f"argument --junit: cannot write {junit}: " in line and why in line  # when parsed
    assert not (tmp_path / "o").exists()  # no scenario ran
    if junit.endswith("read-only.xml"):
        assert Path(junit).read_text() == "keep me"


@pytest.mark.parametrize("out", ["/proc/faultlab-out", "/proc/version/out"])
def test_out_that_cannot_be_made_is_one_line_error(capsys, out):
    line = _one_line_error(capsys, "chaos", "run", "smoke", "--out", out)
    assert "argument --out" in line and out in line


ONE = ("[suite]\nname = 'one'\n[suite.config]\nstart_method = 'fork'\n"
       "[[scenario]]\nname = 'echo'\ncalls = [{method = 'echo', args = [1], timeout = 5.0}]\n")


def test_junit_write_failing_after_the_run_is_one_line_error(tmp_path, capsys):
    path = tmp_path / "one.toml"
    path.write_text(ONE)
    code = main(["chaos", "run", str(path), "--out", str(tmp_path / "o"), "--junit", "/dev/full"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert err.splitlines()[-1] == ("faultlab chaos: error: --junit /dev/full: cannot write: "
                                    "No space left on device")


def test_full_stdout_after_the_run_is_one_line_error_and_the_junit_is_written(tmp_path, capsys):
    path, junit = tmp_path / "one.toml", tmp_path / "junit.xml"
    path.write_text(ONE)
    saved = sys.stdout
    with open("/dev/full", "w") as full:  # the error points its descriptor at /dev/null
        sys.stdout = full
        try:
            code = main(["chaos", "run", str(path), "--out", str(tmp_path / "o"), "--junit", str(junit)])
        finally:
            sys.stdout = saved
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert err.splitlines()[-1] == "faultlab chaos: error: cannot write to stdout: No space left on device"
    assert [c.get("name") for c in ET.parse(junit).getroot().iter("testcase")] == ["echo"]
