"""Chaos targets: TargetRun, the oracles for any target, the comparison and its commands.

Real targets (faultlab, processpool) must pass fault-free and have their kills seen; each
oracle is shown failing on a deliberately broken test-only target (``BadTarget``: a driver
that leaves a stray child, ignores a dead worker, leaks a segment, returns a wrong value...),
in the loky style: one table row per broken behaviour and the invariant that must catch it.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, ClassVar

import psutil
import pytest

from chaos.suites import load_suite
from chaos.targets import get_target, oracles
from chaos.targets.base import FAULT_KINDS, Launch, Target, WorkloadSpec
from chaos.targets.compare import run_target_scenario
from chaos.targets.faultlab_target import python_launch, unit_of_work_values
from chaos.targets.processpool_target import ProcessPoolTarget
from chaos.targets.run import TargetRun
from chaos.targets.scenario import TargetScenario
from faultlab.cli import main

SPEC = {"calls": 8, "call_s": 0.1, "ranks": 2}
MID_WORK = {"after_invoke": 3, "at": [0.02, 0.05]}


def scenario(name: str, fault: str = "none", **fields: Any) -> TargetScenario:
    return TargetScenario.from_dict({"name": name, "fault": fault, "spec": SPEC, **fields}, name)


def run(target: str | Target, sc: TargetScenario, out: Path, seed: int = 1):
    tgt = get_target(target) if isinstance(target, str) else target
    return run_target_scenario(tgt, sc, seed, out / sc.name, out)


# ------------------------------------------------------------------ real targets


@pytest.mark.parametrize("target", ["faultlab", "processpool"])
def test_fault_free_run_passes(target: str, tmp_path: Path) -> None:
    result = run(target, scenario("fault-free"), tmp_path)
    assert (result.outcome, result.violations, result.detected) == ("ok", [], False)
    record = json.loads((tmp_path / "fault-free" / "record.json").read_text())
    assert [c["value"] for c in record["calls"].values()] == list(
        unit_of_work_values(WorkloadSpec(**SPEC)).values())
    assert {p["role"] for p in record["procs"]} >= {"driver", "worker"}


@pytest.mark.parametrize(("target", "cause"), [("faultlab", "rank"), ("processpool", "worker")])
def test_kill_of_a_rank_is_detected_and_its_cause_graded(target: str, cause: str,
                                                         tmp_path: Path) -> None:
    result = run(target, scenario("kill-rank1", "kill", rank=1, **MID_WORK), tmp_path)
    assert result.violations == []
    assert (result.outcome, result.detected, result.cause_named) == ("failed", True, cause)
    assert result.detection_latency_s is not None and 0 < result.detection_latency_s < 5


@pytest.mark.parametrize("busy", [True, False])
def test_faultlab_kill_driver_leaves_no_orphans(busy: bool, tmp_path: Path) -> None:
    fields = MID_WORK if busy else {"busy": False, "at": [0.1, 0.2]}
    result = run("faultlab", scenario("kill-driver", "kill_driver", **fields), tmp_path)
    record = json.loads((tmp_path / "kill-driver" / "record.json").read_text())
    assert record["fault"]["workers"] == ("busy" if busy else "idle")
    assert (result.outcome, result.orphans, result.leftovers, result.violations) == (
        "exit_clean", [], [], [])


def test_processpool_kill_driver_orphans_its_workers(tmp_path: Path) -> None:
    """A real finding the orphan oracle makes: the pool's workers outlive a SIGKILLed driver
    (they hold the call queue's write end themselves); the run still cleans them up."""
    result = run("processpool", scenario("kill-driver", "kill_driver", exit_s=1.0, **MID_WORK),
                 tmp_path)
    assert result.outcome == "orphans"
    assert {o["role"] for o in result.orphans} == {"worker"}
    assert all(v.startswith("[orphan]") for v in result.violations)
    assert not any(psutil.pid_exists(o["pid"]) and psutil.Process(o["pid"]).status() != "zombie"
                   for o in result.orphans)


def test_sigstop_is_a_hang_naming_the_stopped_process(tmp_path: Path) -> None:
    sc = scenario("stop", "stop", rank=1, bound_s=1.0, tolerate=["hang"], **MID_WORK)
    result = run("faultlab", sc, tmp_path)
    assert (result.outcome, result.violations) == ("hang", [])
    assert result.note.endswith("hang")
    assert any("worker rank 1" in t and "stopped" in t for t in result.tolerated)


def test_damage_shm_hits_a_faultlab_segment(tmp_path: Path) -> None:
    result = run("faultlab", scenario("damage", "damage_shm", **MID_WORK), tmp_path)
    record = json.loads((tmp_path / "damage" / "record.json").read_text())
    assert record["fault"]["segment"]["name"].startswith("memfd:faultlab_")
    assert record["fault"]["bytes"] > 0
    assert result.violations == []  # a damaged queue fails calls; never a wrong value or hang
    assert result.outcome in ("failed", "unaffected")


# ------------------------------------------------------------------ a broken test-only target

BAD_DRIVER = r'''
import json, os, subprocess, sys, time
from chaos.targets.protocol import Reporter, call_value

mode, spec, out = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
report = Reporter()
if mode == "nostart":
    sys.exit(3)
procs = [{"role": "driver", "rank": None, "pid": os.getpid()}]
workers = []
if mode in ("deaf", "late"):  # workers answer through files; "deaf": nobody watches them
    code = ("import os, sys, time\n"
            "rank, out, call_s = sys.argv[1], sys.argv[2], float(sys.argv[3])\n"
            "i = 0\n"
            "while True:\n"
            "    if os.path.exists(f'{out}/req-{i}'):\n"
            "        time.sleep(call_s)\n"
            "        open(f'{out}/resp-{i}-{rank}', 'w').close(); i += 1\n"
            "    time.sleep(0.01)\n")
    for r in range(spec["ranks"]):
        w = subprocess.Popen([sys.executable, "-c", code, str(r), out, str(spec["call_s"])])
        workers.append(w)
        procs.append({"role": "worker", "rank": r, "pid": w.pid})
if mode == "stray":  # a child it never names and never ends
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
if mode == "leak":
    path = f"/dev/shm/faultlab_badtarget_{os.getpid()}"
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    os.ftruncate(fd, 4096)
report.ready(procs)
if mode == "fast_exit":
    sys.exit(0)
for i in range(spec["calls"]):
    report.invoke(i, "work")
    if mode in ("deaf", "late"):
        open(f"{out}/req-{i}", "w").close()
        waited, dead = 0, []
        while not all(os.path.exists(f"{out}/resp-{i}-{r}") for r in range(spec["ranks"])):
            time.sleep(0.01)
            waited += 1
            dead = [w for w in workers if waited % 150 == 0 and w.poll() is not None]
            if mode == "late" and dead:  # looks every 1.5 s only
                break
        if mode == "late" and dead:
            report.fail(i, RuntimeError(f"worker pid {dead[0].pid} died"))
            report.error(RuntimeError(f"worker pid {dead[0].pid} died"))
            break
    elif mode != "sprint":  # "sprint": every call returns at once, then the driver lingers
        time.sleep(spec["call_s"])
    values = [call_value(i, r) for r in range(spec["ranks"])]
    if mode == "wrong" and i == 3:
        values[1] += 1
    if mode == "flaky" and i == 2:
        report.fail(i, RuntimeError("call 2 failed by itself"))
    else:
        report.ok(i, values)
report.done()
if mode == "sprint":
    time.sleep(1.0)
'''


class BadTarget(Target):
    name: ClassVar[str] = "bad"
    extra: ClassVar[str] = ""
    applies: ClassVar[frozenset[str]] = frozenset(FAULT_KINDS)
    start_timeout_s: ClassVar[float] = 10.0
    shutdown_timeout_s: ClassVar[float] = 2.0

    def __init__(self, mode: str, script: Path) -> None:
        self.mode, self.script = mode, script

    def unavailable(self) -> str | None:
        return None

    def launch(self, spec: WorkloadSpec, out_dir: str) -> Launch:
        base = python_launch("unused", spec)
        python = "/nonexistent/venv/bin/python" if self.mode == "nolaunch" else sys.executable
        return Launch([python, str(self.script), self.mode, json.dumps(spec.to_json()),
                       out_dir], base.env, base.cwd)

    def expected_values(self, spec: WorkloadSpec) -> dict[int, Any] | None:
        return unit_of_work_values(spec)


@pytest.fixture
def bad(tmp_path: Path) -> Any:
    script = tmp_path / "bad_driver.py"
    script.write_text(BAD_DRIVER)
    return lambda mode: BadTarget(mode, script)


BROKEN = [  # (broken driver, scenario, the invariant that must catch it, words it must say)
    ("stray", scenario("fault-free", exit_s=0.5), "orphan", "helper pid"),
    ("deaf", scenario("kill", "kill", rank=1, bound_s=1.0, exit_s=0.5, **MID_WORK), "hang",
     "worker rank 0 pid"),
    ("deaf", scenario("kill", "kill", rank=1, bound_s=1.0, exit_s=0.5, **MID_WORK), "detection",
     "never reached the caller"),
    ("deaf", scenario("kill", "kill", rank=1, bound_s=1.0, exit_s=0.5, **MID_WORK), "orphan",
     "worker rank 0"),
    ("late", scenario("kill", "kill", rank=1, detect_s=0.5, exit_s=0.5, **MID_WORK), "detection",
     "beyond the 0.5 s bound"),
    ("leak", scenario("fault-free"), "leak", "/dev/shm/faultlab_badtarget_"),
    ("wrong", scenario("fault-free"), "results", "call 3 returned"),
    ("flaky", scenario("fault-free"), "fault_free", "call 2 failed with no fault"),
    ("nostart", scenario("fault-free"), "start", "before ready"),
    ("nolaunch", scenario("fault-free"), "start", "could not be started"),
    ("fast_exit", scenario("kill", "kill", rank=1, **MID_WORK), "unfired", "never fired"),
    ("sprint", scenario("kill-driver", "kill_driver", **MID_WORK), "unfired",
     "meant to land mid-work but came after the last call returned"),
]


@pytest.mark.parametrize(("mode", "sc", "invariant", "words"), BROKEN,
                         ids=[f"{m}-{i}" for m, _, i, _ in BROKEN])
def test_each_oracle_fails_a_broken_run(mode: str, sc: TargetScenario, invariant: str,
                                        words: str, bad: Any, tmp_path: Path) -> None:
    result = run(bad(mode), sc, tmp_path)
    mine = [v for v in result.violations if v.startswith(f"[{invariant}]")]
    assert mine and any(words in v for v in mine), result.violations
    assert not any(psutil.pid_exists(o["pid"]) and psutil.Process(o["pid"]).status() != "zombie"
                   for o in result.orphans)  # recorded, then cleaned up


def test_the_same_oracles_pass_the_plain_bad_target(bad: Any, tmp_path: Path) -> None:
    """The broken runs above fail for their fault alone: the plain driver passes."""
    result = run(bad("plain"), scenario("fault-free"), tmp_path)
    assert (result.outcome, result.violations) == ("ok", [])


def test_hang_names_the_stuck_processes_and_their_status(bad: Any, tmp_path: Path) -> None:
    sc = scenario("kill", "kill", rank=1, bound_s=1.0, exit_s=0.5, **MID_WORK)
    record = TargetRun(bad("deaf"), sc, 1, tmp_path).run()
    stuck = record.stuck[0]
    assert len(stuck["calls"]) == 1 and stuck["calls"][0] >= 2  # the call the kill hit
    statuses = {(p["role"], p["rank"]): p["status"] for p in stuck["procs"]}
    assert statuses[("worker", 1)] in ("gone", "zombie")
    assert statuses[("worker", 0)] in ("sleeping", "running")
    assert record.ended_by == "hang"


def test_damage_shm_is_not_applicable_without_a_segment(bad: Any, tmp_path: Path) -> None:
    result = run(bad("plain"), scenario("damage", "damage_shm", **MID_WORK), tmp_path)
    assert (result.outcome, result.violations) == ("not_applicable", [])
    assert "no /dev/shm or memfd mapping" in result.note


@pytest.mark.parametrize(("message", "grade"), [
    ("worker rank 1 (pid 4242) was killed by SIGKILL", "rank"),
    ("rank 1 exited with exit code -9", "rank"),
    ("A process in the process pool was terminated abruptly", "worker"),
    ("worker died", "worker"),
    ("rank 0 (pid 4242) was killed by SIGKILL", "worker"),  # names another rank than the fault's
    ("request queue damaged: chunk 3", "generic"),
    ("RuntimeError: something went wrong", "generic"),
])
def test_cause_grades(message: str, grade: str) -> None:
    assert oracles.grade_message(message, rank=1, pid=4242) == grade


# ------------------------------------------------------------------ suite and commands


def test_fault_moment_is_seeded_and_the_same_for_every_target() -> None:
    sc = scenario("kill", "kill", **MID_WORK)
    assert sc.fault_delay_s(3) == scenario("kill", "kill", **MID_WORK).fault_delay_s(3)
    assert sc.fault_delay_s(3) != sc.fault_delay_s(4)
    assert all(0.02 <= sc.fault_delay_s(seed) <= 0.05 for seed in range(20))


@pytest.mark.parametrize(("table", "where"), [
    ("name = 'a'\nfault = 'explode'", "target_scenario[0].fault"),
    ("name = 'a'\nfault = 'kill'\nrnak = 1", "target_scenario[0].rnak"),
    ("name = 'a'\nfault = 'kill'\nat = [0.5, 0.1]", "target_scenario[0].at"),
    ("name = 'a'\nafter_invoke = 0", "target_scenario[0].after_invoke"),
    ("name = 'a'\ntolerate = ['sloth']", "target_scenario[0].tolerate"),
    ("name = 'a'\n[target_scenario.spec]\ncals = 3", "target_scenario[0].spec.cals"),
])
def test_malformed_target_scenario_names_file_and_key(table: str, where: str, tmp_path: Path) -> None:
    from chaos.suites import SuiteError

    path = tmp_path / "bad_targets.toml"
    path.write_text(f"[[target_scenario]]\n{table}\n")
    with pytest.raises(SuiteError) as info:
        load_suite(str(path))
    assert "bad_targets.toml" in str(info.value) and where in str(info.value)


def test_targets_suite_has_the_issue_scenarios() -> None:
    suite = load_suite("targets")
    by_fault = {(s.fault, s.rank if s.fault in ("kill", "term", "stop") else s.busy)
                for s in suite.target_scenarios}
    assert {("none", True), ("kill", 0), ("kill", 1), ("term", 1), ("stop", 1),
            ("kill_driver", False), ("kill_driver", True), ("damage_shm", True)} <= by_fault


def test_unknown_target_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["chaos", "run", "targets", "--target", "nope", "--out", str(tmp_path / "o")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown target 'nope'" in err


def test_run_on_a_missing_target_is_one_line_exit_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(ProcessPoolTarget, "unavailable", lambda self: "pip install -e '.[pp]'")
    assert main(["chaos", "run", "targets", "--target", "processpool", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "target processpool" in err and "'.[pp]'" in err


def test_compare_stops_on_a_missing_target_or_skips_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(ProcessPoolTarget, "unavailable",
                        lambda self: "pip install -e '.[demo-extra]'")
    args = ["chaos", "compare", "targets", "--targets", "faultlab,processpool", "-k", "fault-free"]
    assert main([*args, "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "processpool" in err and "demo-extra" in err
    assert not (tmp_path / "a" / "compare.json").exists()
    assert main([*args, "--skip-missing", "--out", str(tmp_path / "b")]) == 0
    data = json.loads((tmp_path / "b" / "compare.json").read_text())
    assert data["targets"] == ["faultlab"] and data["skipped"][0]["target"] == "processpool"
    assert "processpool" in (tmp_path / "b" / "compare.md").read_text().split("Skipped")[1]


def test_compare_writes_rows_markdown_and_junit(tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    code = main(["chaos", "compare", "targets", "--targets", "faultlab,processpool", "--seeds", "2",
                 "-k", "fault-free|sigkill-rank1", "--out", str(out)])
    assert code == 0
    data = json.loads((out / "compare.json").read_text())
    assert data["targets"] == ["faultlab", "processpool"]
    assert len(data["rows"]) == 2 * 2 * 2
    keys = {"target", "scenario", "seed", "fault", "outcome", "detected", "detection_latency_s",
            "cause_named", "orphans", "leftovers", "violations"}
    assert all(keys <= set(row) for row in data["rows"])
    kills = [r for r in data["rows"] if r["fault"] == "kill"]
    assert all(r["detected"] and r["detection_latency_s"] > 0 for r in kills)
    assert {r["cause_named"] for r in kills if r["target"] == "faultlab"} == {"rank"}
    assert "| sigkill-rank1-mid-work |" in (out / "compare.md").read_text()
    for name in ("faultlab", "processpool"):
        suite = ET.parse(out / f"junit-{name}.xml").getroot().find("testsuite")
        assert suite is not None and suite.get("tests") == "4"


def test_chaos_run_with_a_target(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    junit = tmp_path / "j.xml"
    code = main(["chaos", "run", "targets", "--target", "processpool", "-k", "^fault-free$",
                 "--out", str(tmp_path / "o"), "--junit", str(junit)])
    assert code == 0
    assert "fault-free" in capsys.readouterr().out
    assert json.loads((tmp_path / "o" / "summary.json").read_text())[0]["outcome"] == "ok"
    assert junit.exists()


@pytest.mark.parametrize("name", ["faultlab", "vllm", "processpool", "loky", "pebble", "ray"])
def test_a_target_sets_only_settings_the_observer_reads(name: str) -> None:
    """A misspelt class setting (``exit_timeout_s`` for ``shutdown_timeout_s``) is silently
    ignored and the default bound applies: every public class attribute of a target must be
    one that Target declares."""
    import importlib

    cls = type(importlib.import_module(f"chaos.targets.{name}_target").TARGET)
    declared = {k for k in vars(Target).get("__annotations__", {})}
    own = {k for klass in cls.__mro__[:-1] if issubclass(klass, Target) and klass is not Target
           for k, v in vars(klass).items() if not k.startswith("_") and not callable(v)
           and not isinstance(v, (property, staticmethod, classmethod))}
    assert own <= declared, f"{cls.__name__} sets {sorted(own - declared)}, which Target does not declare"


def test_a_faults_delay_counts_from_when_the_driver_wrote_its_trigger() -> None:
    """An observer that reads an invoke 0.8 s late (a loaded machine) must not add those 0.8 s
    to the fault's delay: mid-work faults would land after the work."""
    import time as clock

    from chaos.targets.run import _since

    now_ns = clock.time_ns()
    late = _since({"ev": "invoke", "t": now_ns - 800_000_000, "rt": now_ns})
    assert 0.75 < clock.monotonic() - late < 0.9
    assert abs(_since({"ev": "invoke", "t": now_ns, "rt": now_ns}) - clock.monotonic()) < 0.05
