"""Verdicts about a target that do not depend on the machine (issues 31 and 32).

    two runs at once        a run's leftovers are exactly its own: a second run littering
                            /tmp and /dev/shm with files the first's temp_globs match is never
                            charged to the first, and its own litter leaves the host with it
    a pid not the run's     a driver naming an unrelated process (another session's sleep) as
                            a worker: never reported as an orphan, never signalled; recorded
                            in ``disowned``, and a fault aimed at it is not applicable
    a signal to observer    mid-SIGSTOP, ``faultlab chaos run`` gets SIGHUP (a closed terminal),
                            SIGTERM, SIGINT or SIGQUIT: it resumes what it stopped, SIGKILLs the
                            run's tree, writes its record (ended_by "observer"), exits 128+sig
    the observer's priority it watches at SCHED_FIFO, its driver runs as an ordinary task

The drivers are test-only (``LITTER_DRIVER``), in the shape of test_targets.BadTarget.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, ClassVar

import psutil
import pytest

from chaos.targets.base import FAULT_KINDS, Launch, Target, WorkloadSpec
from chaos.targets.faultlab_target import python_launch, unit_of_work_values
from chaos.targets.run import TargetRun
from chaos.targets.scenario import TargetScenario

ROOT = Path(__file__).resolve().parents[2]
SPEC = {"calls": 4, "call_s": 0.05, "ranks": 2}

LITTER_DRIVER = r'''
import json, os, subprocess, sys, time
from chaos.targets.protocol import Reporter, call_value

mode, spec, out, tag = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], sys.argv[4]
report = Reporter()
procs = [{"role": "driver", "rank": None, "pid": os.getpid()}]
for r in range(spec["ranks"]):
    if mode == "impostor" and r == 1:  # someone else's process, named as a worker
        procs.append({"role": "worker", "rank": r, "pid": int(os.environ["IMPOSTOR_PID"])})
        continue
    w = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    procs.append({"role": "worker", "rank": r, "pid": w.pid})
if mode == "litter":  # files its temp_globs match, left behind
    open(f"/tmp/faultlab_attr_{tag}_tmp", "w").close()
    open(f"/dev/shm/faultlab_attr_{tag}_shm", "w").close()
with open(f"{out}/sched", "w") as f:
    f.write(str(os.sched_getscheduler(0)))
report.ready(procs)
open(f"{out}/started", "w").close()
while mode == "wait" and not os.path.exists(f"{out}/go"):
    time.sleep(0.02)
for i in range(spec["calls"]):
    report.invoke(i, "work")
    time.sleep(spec["call_s"])
    report.ok(i, [call_value(i, r) for r in range(spec["ranks"])])
report.done()
for p in procs[1:]:
    if p["pid"] != int(os.environ.get("IMPOSTOR_PID", "0")):
        os.kill(p["pid"], 9)
'''


class LitterTarget(Target):
    name: ClassVar[str] = "litter"
    extra: ClassVar[str] = ""
    applies: ClassVar[frozenset[str]] = frozenset(FAULT_KINDS)
    temp_globs: ClassVar[tuple[str, ...]] = ("/tmp/faultlab_attr_*", "/dev/shm/faultlab_attr_*")
    start_timeout_s: ClassVar[float] = 30.0
    shutdown_timeout_s: ClassVar[float] = 5.0

    def __init__(self, mode: str, script: Path, tag: str, env: dict[str, str] | None = None):
        self.mode, self.script, self.tag, self.env = mode, script, tag, env or {}

    def unavailable(self) -> str | None:
        return None

    def launch(self, spec: WorkloadSpec, out_dir: str) -> Launch:
        base = python_launch("unused", spec)
        return Launch([sys.executable, str(self.script), self.mode, json.dumps(spec.to_json()),
                       out_dir, self.tag], {**base.env, **self.env}, base.cwd)

    def expected_values(self, spec: WorkloadSpec) -> dict[int, Any] | None:
        return unit_of_work_values(spec)


def scenario(name: str, fault: str = "none", **fields: Any) -> TargetScenario:
    return TargetScenario.from_dict({"name": name, "fault": fault, "spec": SPEC, "exit_s": 1.0,
                                     **fields}, name)


@pytest.fixture
def litter(tmp_path: Path) -> Any:
    script = tmp_path / "litter_driver.py"
    script.write_text(LITTER_DRIVER)
    tag = f"t{os.getpid()}x{time.monotonic_ns()}"
    yield lambda mode, **env: LitterTarget(mode, script, tag, env)
    for path in glob.glob(f"/tmp/faultlab_attr_{tag}_*") + glob.glob(f"/dev/shm/faultlab_attr_{tag}_*"):
        os.unlink(path)  # only what a run left on the host (none once runs are fenced)


def _namespaces_or_skip() -> None:
    try:
        from chaos.targets import private_mounts
    except ImportError:
        return  # an observer without namespaces: the tests below must fail on it, not skip
    why = private_mounts.unavailable()
    if why is not None:
        pytest.skip(f"no private mount namespace here: {why}")


def _wait_for(path: Path, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{what} never came"
        time.sleep(0.02)


# ------------------------------------------------------------------ two runs at once


def test_two_runs_at_once_never_report_each_others_files(litter: Any, tmp_path: Path) -> None:
    """Run "quiet" waits (after ready) while run "litter" starts, leaves a /tmp file and a
    /dev/shm file its temp_globs match, and ends; then quiet finishes.  quiet's leftovers
    must not hold litter's files; litter's must be exactly its own, gone from the host."""
    _namespaces_or_skip()
    quiet_out, litter_out = tmp_path / "quiet", tmp_path / "litter"
    quiet: list[Any] = []
    thread = threading.Thread(target=lambda: quiet.append(
        TargetRun(litter("wait"), scenario("fault-free"), 1, quiet_out).run()))
    thread.start()
    try:
        _wait_for(quiet_out / "started", "the quiet run's ready")
        mine = TargetRun(litter("litter"), scenario("fault-free"), 1, litter_out).run()
    finally:
        (quiet_out / "go").parent.mkdir(parents=True, exist_ok=True)
        (quiet_out / "go").touch()
        thread.join(120)
    assert quiet and quiet[0].driver_returncode == 0, quiet
    tag = litter("x").tag
    assert quiet[0].leftovers == [], "a run was charged another run's files"
    assert mine.leftovers == [f"/dev/shm/faultlab_attr_{tag}_shm", f"/tmp/faultlab_attr_{tag}_tmp"]
    assert mine.attribution == quiet[0].attribution == "namespace"
    assert not glob.glob(f"/tmp/faultlab_attr_{tag}_*") + glob.glob(f"/dev/shm/faultlab_attr_{tag}_*")


def test_without_namespaces_the_record_says_attribution_is_by_name(
        litter: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from chaos.targets import private_mounts

    monkeypatch.setattr(private_mounts, "_probe", ["not root: no private mount namespace"])
    record = TargetRun(litter("plain"), scenario("fault-free"), 1, tmp_path).run()
    assert record.attribution == "name: not root: no private mount namespace"
    assert record.leftovers == [] and record.driver_returncode == 0


# ------------------------------------------------------------------ a pid not the run's


@pytest.fixture
def stranger() -> Any:
    """A process of another session, which no run started."""
    proc = subprocess.Popen(["sleep", "600"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


def test_a_process_the_driver_names_but_does_not_own_is_left_alone(
        litter: Any, stranger: subprocess.Popen[bytes], tmp_path: Path) -> None:
    target = litter("impostor", IMPOSTOR_PID=str(stranger.pid))
    record = TargetRun(target, scenario("fault-free"), 1, tmp_path / "ff").run()
    assert stranger.poll() is None, "the observer signalled a process that is not the run's"
    assert stranger.pid not in [o["pid"] for o in record.orphans]
    assert stranger.pid not in [p["pid"] for p in record.procs]
    assert [(d["role"], d["rank"], d["pid"]) for d in record.disowned] == [
        ("worker", 1, stranger.pid)]
    assert "sleep" in record.disowned[0]["why"]

    kill = scenario("kill", "kill", rank=1, after_invoke=1, at=[0.01, 0.02])
    record = TargetRun(target, kill, 1, tmp_path / "kill").run()
    assert stranger.poll() is None
    assert not record.applicable and "not the run's" in record.note


# ------------------------------------------------------------------ SIGHUP to the observer

STOP_SUITE = """
[[target_scenario]]
name = "stop-rank1"
fault = "stop"
rank = 1
after_invoke = 1
at = [0.01, 0.02]
bound_s = 600.0
[target_scenario.spec]
calls = 400
call_s = 0.1
ranks = 2
"""


@pytest.mark.parametrize("signum", [signal.SIGHUP, signal.SIGTERM, signal.SIGINT, signal.SIGQUIT],
                         ids=lambda s: signal.Signals(s).name)
def test_a_signal_to_the_observer_resumes_and_takes_the_run_down(signum: int,
                                                                  tmp_path: Path) -> None:
    """``faultlab chaos run`` mid-SIGSTOP (rank 1 stopped, its bound far away) gets a signal
    (SIGHUP: its terminal closed): nothing of the run may stay, nothing stopped."""
    suite = tmp_path / "stop.toml"
    suite.write_text(STOP_SUITE)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    observer = subprocess.Popen([sys.executable, "-m", "faultlab.cli", "chaos", "run", str(suite),
                                 "--target", "faultlab", "--out", str(tmp_path / "out")],
                                env=env, cwd=ROOT, start_new_session=True,
                                stdout=subprocess.DEVNULL)
    run_procs: list[psutil.Process] = []
    try:
        run_procs = _run_tree_once_a_worker_is_stopped(observer)
        observer.send_signal(signum)
        assert observer.wait(60) == 128 + signum
        _gone, alive = psutil.wait_procs(run_procs, timeout=10)
        assert alive == [], f"the run outlived its observer: {alive}"
        record = json.loads(next((tmp_path / "out").rglob("record.json")).read_text())
        name = signal.Signals(signum).name
        assert (record["ended_by"], record["observer_signal"]) == ("observer", name)
        assert record["fault"]["resumed_ns"] is not None
    finally:  # what a broken observer left: nothing, once it is fixed
        if observer.poll() is None:
            observer.kill()
        observer.wait()
        for proc in run_procs:
            _end(proc)


def _run_tree_once_a_worker_is_stopped(observer: subprocess.Popen[bytes]) -> list[psutil.Process]:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert observer.poll() is None, "the observer ended before its fault"
        tree = psutil.Process(observer.pid).children(recursive=True)
        if any(_status(p) == psutil.STATUS_STOPPED for p in tree):
            return tree
        time.sleep(0.05)
    raise AssertionError("no worker was ever stopped")


def _status(proc: psutil.Process) -> str:
    try:
        return str(proc.status())
    except psutil.Error:
        return "gone"


def _end(proc: psutil.Process) -> None:
    for sig in (signal.SIGCONT, signal.SIGKILL):
        try:
            proc.send_signal(sig)
        except psutil.Error:
            return
    try:
        proc.wait(5)
    except psutil.Error:
        pass


# ------------------------------------------------------------------ the observer's priority


def test_the_observer_watches_at_realtime_and_its_driver_runs_as_usual(
        litter: Any, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("SCHED_FIFO needs root")
    before = os.sched_getscheduler(0)
    record = TargetRun(litter("plain"), scenario("fault-free"), 1, tmp_path).run()
    assert record.observer_priority.startswith("SCHED_FIFO")
    assert int((tmp_path / "sched").read_text()) == os.SCHED_OTHER  # not inherited
    assert os.sched_getscheduler(0) == before  # given back after the run
    assert record.observer_lag_ms >= 0


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_two_vllm_runs_at_once_report_only_their_own(tmp_path: Path) -> None:
    """The issue's case with the real engine: a fault-free vLLM run beside a vLLM run whose
    driver is SIGKILLed mid-work (it leaves vLLM's rendezvous and all-reduce files).  Two
    engines start side by side: 1-3 minutes on two shared cores."""
    from chaos.targets.vllm_target import TARGET as VLLM

    if VLLM.unavailable() is not None:
        pytest.skip(f"vllm target: {VLLM.unavailable()}")
    _namespaces_or_skip()
    spec = {"calls": 6, "tokens": 8, "ranks": 2}
    runs = {"quiet": scenario("fault-free", spec=spec),
            "killed": scenario("kill-driver", "kill_driver", spec=spec, after_invoke=2,
                               at=[0.01, 0.02])}
    host_before = set(glob.glob("/tmp/vllm_dist_*") + glob.glob("/dev/shm/vllm_dist_*"))
    records: dict[str, Any] = {}
    threads = [threading.Thread(target=lambda n=name, sc=sc: records.__setitem__(
        n, TargetRun(VLLM, sc, 1, tmp_path / n).run())) for name, sc in runs.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(800)
    assert records["quiet"].driver_returncode == 0, records["quiet"].stderr_tail[-600:]
    assert records["killed"].ended_by == "fault"
    assert records["quiet"].leftovers == [], "the fault-free run was charged the other's files"
    left = set(glob.glob("/tmp/vllm_dist_*") + glob.glob("/dev/shm/vllm_dist_*"))
    assert left <= host_before, f"a run's files outlived it on the host: {left - host_before}"


def test_the_base_of_an_observer_that_is_gone_is_swept(tmp_path: Path) -> None:
    """An observer SIGKILLed cannot remove its run's BASE; the next run's create() does."""
    from chaos.targets import private_mounts

    gone = subprocess.Popen(["true"])
    gone.wait()  # its pid is free now (and, for a moment, unlikely to be taken again)
    stale = Path(private_mounts.SHM) / f"{private_mounts._PREFIX}{gone.pid}.test"
    (stale / "shm").mkdir(parents=True)
    (stale / "shm" / "psm_left").touch()
    live = private_mounts.RunMounts.create()  # ours: its observer (this process) lives
    try:
        assert not stale.exists()
        assert Path(live.base).exists()
    finally:
        live.remove()
        if stale.exists():
            shutil.rmtree(stale)
