"""``pytest --faultlab-suite``: a suite's scenarios as test items, run for real.

The runs are pytest in a subprocess (``pytester.runpytest_subprocess``) on a tiny suite, so
the executors, their processes and their segments are real, and so is the ``pytest11`` entry
point that loads the plugin; collection alone runs in this process (a subprocess costs
5-10 s of start-up on the loaded machine).

    case                          command                                 expected
    ids, and only the suite       --collect-only (a test file beside it)  TINY ids, the file not collected
    path arguments still count    --collect-only test_beside.py           the suite and the file
    -k, -m (fault-kind, table)    --collect-only -k / -m                  the matching ids only
    malformed suite, same name,   --faultlab-suite bad.toml               usage error naming the file
    unknown target
    run, junit, a failure         --junitxml                              2 passed, 1 failed with its
                                                                          violation and a replay line
                                                                          that reproduces it
    xdist                         -n 2                                    every scenario once, both workers
    option absent                 a plain run                             chaos never imported
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import chaos.pytest_plugin  # noqa: F401 - loaded once here, not again in each in-process run
from faultlab.cli import main

pytest_plugins = ["pytester"]

TINY = """
[suite]
name = "tiny"
seed = 5
[suite.config]
start_method = "fork"

[[scenario]]
name = "kill-mid-call"
[[scenario.faults]]
kind = "kill_worker"
rank = 1
on_call = ["sleep", 1]

[[scenario]]
name = "slow-echoes"
calls = [{method = "echo", args = [1], timeout = 5.0, repeat = 4}]
[[scenario.faults]]
kind = "slow_worker"
rank = 1
on_call = ["echo", 2]
delay = 0.01

[[scenario]]
name = "wrong-expectation"  # the kill makes it fail fast: the "outcome" invariant breaks
expect = "fault_free"
[[scenario.faults]]
kind = "kill_worker"
rank = 0
on_call = ["sleep", 1]
"""
OTHER_TABLES = """
[suite]
name = "other"
[[recovery]]
name = "restart"
fault = "kill"
rank = 1
max_tokens = 12
steps = [2, 6]
[[target_scenario]]
name = "outside-kill"
fault = "kill"
"""
IDS = ["tiny::kill-mid-call", "tiny::slow-echoes", "tiny::wrong-expectation"]
BESIDE = "def test_beside():\n    pass\n"
# Hypothesis' plugin imports hypothesis at the end of every run: 5-8 s on the loaded machine
# in a subprocess, and in-process too (pytester drops the modules a run imported).
QUICK = ("-p", "no:cacheprovider", "-p", "no:hypothesispytest")


@pytest.fixture
def suite(pytester: pytest.Pytester) -> Path:
    pytester.makefile(".py", test_beside=BESIDE)
    return pytester.makefile(".toml", tiny=TINY)


def collected(pytester: pytest.Pytester, *args: str) -> list[str]:
    result = pytester.runpytest_inprocess(*QUICK, "--strict-markers", "--collect-only", "-q",
                                          *args)
    assert result.ret == 0, result.stdout.str() + result.stderr.str()
    return [line for line in result.outlines if "::" in line or line.endswith(".py")]


def test_the_entry_point_is_loaded(request: pytest.FixtureRequest) -> None:
    """If this fails, reinstall the checkout (pip install -e .): pytest loads the plugin
    through its ``pytest11`` entry point; without --faultlab-suite nothing more registers."""
    import faultlab.pytest_entry as entry

    assert request.config.pluginmanager.get_plugin("faultlab") is entry
    assert request.config.pluginmanager.get_plugin(entry.PLUGIN_NAME) is None


def test_collects_one_item_per_scenario_and_only_the_suite(pytester: pytest.Pytester,
                                                         suite: Path) -> None:
    assert collected(pytester, "--faultlab-suite", str(suite)) == IDS
    both = collected(pytester, "--faultlab-suite", str(suite), "test_beside.py")
    assert both == ["test_beside.py::test_beside", *IDS]


def test_k_and_fault_kind_markers_select(pytester: pytest.Pytester, suite: Path) -> None:
    assert collected(pytester, "--faultlab-suite", str(suite), "-k", "kill-mid or slow") == IDS[:2]
    assert collected(pytester, "--faultlab-suite", str(suite), "-m", "faultlab_slow_worker") == IDS[1:2]
    assert collected(pytester, "--faultlab-suite", str(suite), "-k", "kill_worker") == IDS[::2]
    other = pytester.makefile(".toml", other=OTHER_TABLES)
    both = ["--faultlab-suite", str(suite), "--faultlab-suite", str(other)]
    assert collected(pytester, *both, "-m", "faultlab_recovery") == ["other::restart"]
    assert collected(pytester, *both, "-m", "faultlab_target_scenario") == ["other::outside-kill"]
    assert collected(pytester, *both, "-m", "faultlab_kill") == ["other::restart", "other::outside-kill"]


def test_a_bad_suite_is_a_usage_error(pytester: pytest.Pytester, suite: Path) -> None:
    pytester.makefile(".toml", bad="[[scenario]]\nname = 'a'\n[[scenario.faults]]\nkind = 'explode'\n")
    result = pytester.runpytest_inprocess(*QUICK, "--faultlab-suite", "bad.toml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--faultlab-suite bad.toml: bad.toml: scenario[[]0].faults[[]0].kind*"])
    twice = pytester.runpytest_inprocess(*QUICK, "--faultlab-suite", str(suite),
                                         "--faultlab-suite", str(suite))
    assert twice.ret == pytest.ExitCode.USAGE_ERROR
    twice.stderr.fnmatch_lines(["*a suite named 'tiny' is already collected*"])
    target = pytester.runpytest_inprocess(*QUICK, "--faultlab-suite", str(suite),
                                          "--faultlab-target", "nosuch")
    assert target.ret == pytest.ExitCode.USAGE_ERROR
    target.stderr.fnmatch_lines(["*--faultlab-target nosuch: unknown target; known: faultlab, *"])


def test_runs_record_properties_and_report_a_failure_with_its_replay(
        pytester: pytest.Pytester, suite: Path) -> None:
    result = pytester.runpytest_subprocess(*QUICK, "--faultlab-suite", str(suite),
                                           "--junitxml=junit.xml", "--faultlab-out=runs", timeout=120)
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines([
        "*chaos scenario tiny::wrong-expectation broke 1 invariant(s) (seed 5; kill_worker):",
        "*[[]fault_free] the executor failed in a run expected fault_free: worker rank 0*",
        "expected fault_free, observed fail_fast, detection latency *",
        "*Reproduce with: faultlab chaos replay *wrong-expectation"])
    cases = {c.get("name"): c for c in ET.parse(pytester.path / "junit.xml").iter("testcase")}
    assert set(cases) == {i.split("::")[1] for i in IDS}
    props = {name: {p.get("name"): p.get("value") for p in case.iter("property")}
             for name, case in cases.items()}
    assert float(props["kill-mid-call"]["detection_latency_s"]) > 0
    assert props["kill-mid-call"]["outcome"] == "fail_fast"
    assert props["wrong-expectation"]["violations"] == "1"
    assert cases["wrong-expectation"].find("failure") is not None
    replay = next(line for line in result.outlines if "Reproduce with:" in line)
    command = shlex.split(replay.split("Reproduce with: ", 1)[1])
    assert command[:3] == ["faultlab", "chaos", "replay"]
    assert Path(command[3]) == pytester.path / "runs" / "tiny" / "wrong-expectation"
    assert main([*command[1:], "--out", str(pytester.path / "replayed")]) == 1  # it fails again


def test_two_xdist_workers_run_every_scenario_once(pytester: pytest.Pytester, suite: Path) -> None:
    more = TINY.replace('name = "wrong-expectation"', 'name = "second-kill"').replace(
        'expect = "fault_free"', 'expect = "fail_fast"')
    pytester.makefile(".toml", tiny=more)
    result = pytester.runpytest_subprocess(*QUICK, "-n", "2", "--faultlab-suite", str(suite),
                                           "-k", "not slow", "-v", "--faultlab-out=runs", timeout=120)
    result.assert_outcomes(passed=2)
    ran = [line for line in result.outlines if "PASSED" in line and "tiny::" in line]
    assert sorted(line.split()[-1] for line in ran) == ["tiny::kill-mid-call", "tiny::second-kill"]
    assert {line.split()[0] for line in ran} == {"[gw0]", "[gw1]"}, ran  # each worker ran one
    for name in ("kill-mid-call", "second-kill"):  # each in a run directory of its own
        saved = json.loads((pytester.path / "runs" / "tiny" / name / "result.json").read_text())
        assert (saved["name"], saved["violations"]) == (name, [])


def test_without_the_option_nothing_of_chaos_loads(pytester: pytest.Pytester) -> None:
    pytester.makefile(".py", test_plain="import sys\n\ndef test_plain():\n"
                                        "    assert 'chaos' not in sys.modules\n")
    pytester.runpytest_subprocess(*QUICK, timeout=120).assert_outcomes(passed=1)


def test_reproduce_lines_name_a_command_that_reaches_the_table(tmp_path: Path) -> None:
    """replay reads [[scenario]] runs only; chaos run -k reaches a [[recovery]] table, and a
    [[target_scenario]] on faultlab only in a suite of target scenarios alone."""
    from chaos.pytest_plugin import Options, cases, reproduce_command
    from chaos.suites import load_suite

    path = tmp_path / "other.toml"
    path.write_text(OTHER_TABLES)
    recovery, outside = cases(load_suite(str(path)))
    options = Options(seed=None, out=None, start_method=None, target="faultlab")
    run = reproduce_command(recovery, 3, tmp_path / "r", options)
    assert shlex.split(run)[:7] == ["faultlab", "chaos", "run", str(path), "--seed", "3", "-k"]
    assert shlex.split(run)[7] == "^restart$"
    assert reproduce_command(outside, 3, tmp_path / "o", options) == (
        f"pytest --faultlab-suite {path} --faultlab-seed 3 -k outside-kill")
    on_ray = dataclasses.replace(options, target="ray")
    assert "--target ray -k '^outside\\-kill$'" in reproduce_command(outside, 3, tmp_path, on_ray)
