"""Kill-the-driver scenarios: the driver runs in a subprocess that chaos SIGKILLs.

    chaos process                                 driver subprocess (python -m chaos.driver_run)
    spawn ── driver.pkl (cfg, workload) ──►       MultiprocExecutor, Injector, CallCounter
          ◄── "started {pids}" ──────────         workload(RecordingExecutor(ex))
          ◄── "kill" (k-th call enqueued) ────    (blocks in the failpoint until killed)
    SIGKILL at that moment or at t0 + at_s
    then: every worker gone within its bound?  /dev/shm/faultlab_<driver pid>_* gone?
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import cloudpickle

from chaos import points, resources
from chaos.control import ENV_VAR, ControlDir
from chaos.injector import Injector
from chaos.oracles import Bounds, Violation
from chaos.outcomes import Outcome
from chaos.plan import FaultPlan, ResolvedFault
from chaos.recording import RecordingExecutor
from chaos.workloads import Workload
from executor import ExecutorConfig, failpoints

if TYPE_CHECKING:
    from chaos.scenario import ScenarioResult

_STARTUP_S = 60.0


def run_with_driver_process(cfg: ExecutorConfig, workload: Workload, plan: FaultPlan, out: Path,
                            name: str, bounds: Bounds, executor_class: type) -> ScenarioResult:
    from chaos.scenario import ScenarioResult, annotate, prepare_forkserver, telemetry_env

    t0 = time.monotonic()
    ctl, resolved = ControlDir(out / "ctl"), plan.resolve()
    ctl.write_plan(resolved, plan.seed)
    spec = out / "driver.pkl"
    spec.write_bytes(cloudpickle.dumps({"cfg": cfg, "workload": workload, "cls": executor_class}))
    prepare_forkserver(cfg)
    env = dict(os.environ, **{telemetry_env(): str(out / "trace"), ENV_VAR: str(ctl.path),
                              failpoints.ENV_VAR: points.INSTALLER,
                              "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)})
    with open(out / "driver.log", "wb") as log:
        child = subprocess.Popen([sys.executable, "-m", "chaos.driver_run", str(spec)],
                                 stdout=subprocess.PIPE, stderr=log, env=env)
        try:
            violations, _pids, killed = _supervise(child, ctl, resolved, bounds, bounds.workload_s)
        finally:
            if child.stdout is not None:
                child.stdout.close()
    timeline = annotate(ctl.timeline(), resolved)
    outcome = Outcome.EXIT_CLEAN if killed and not violations else None
    return ScenarioResult(
        name=name, seed=plan.seed, violations=violations, trace_dir=out / "trace", out_dir=out,
        calls=[], faults=timeline, fired_points={}, expected=Outcome.EXIT_CLEAN, outcome=outcome,
        detection_latency_s=None, shutdown_s=None, wall_s=time.monotonic() - t0,
        unfired=[] if killed else [r.index for r in resolved if r.fault.kind == "kill_driver"],
    )


def _supervise(child: subprocess.Popen[bytes], ctl: ControlDir, resolved: list[ResolvedFault],
               bounds: Bounds, limit_s: float) -> tuple[list[Violation], list[int], bool]:
    timed = [r for r in resolved if r.fault.kind == "kill_driver" and r.at_s is not None]
    pids: list[int] = []
    started: float | None = None
    deadline = time.monotonic() + _STARTUP_S + limit_s
    kill_at = float("inf")
    assert child.stdout is not None
    while time.monotonic() < deadline:
        line = _readline(child.stdout, min(0.05, max(0.0, kill_at - time.monotonic())))
        if line.startswith("started"):
            pids, started = json.loads(line.split(" ", 1)[1]), time.monotonic()
            kill_at = started + min((r.at_s or 0.0 for r in timed), default=float("inf"))
        reason = "call" if line.startswith("kill") else "time" if time.monotonic() >= kill_at else ""
        if reason:
            r = _first_kill(resolved, reason)
            return _kill_and_check(child, ctl, r, pids, bounds, reason == "time"), pids, True
        if line.startswith("done") or (not line and child.poll() is not None):
            child.wait()
            return [], pids, False
    child.kill()
    child.wait()
    return [Violation("hang", f"the driver subprocess did not finish within {limit_s:g} s")], pids, False


def _first_kill(resolved: list[ResolvedFault], reason: str) -> ResolvedFault:
    kills = [r for r in resolved if r.fault.kind == "kill_driver"]
    return next((r for r in kills if (r.at_s is None) == (reason == "call")), kills[0])


def _readline(stream: Any, timeout: float) -> str:
    poller = select.poll()  # never select(): the caller may hold fds past 1,024
    poller.register(stream, select.POLLIN)
    ready = poller.poll(max(0, int(timeout * 1000)))
    return stream.readline().decode().strip() if ready else ""


def _kill_and_check(child: subprocess.Popen[bytes], ctl: ControlDir, r: ResolvedFault,
                    pids: list[int], bounds: Bounds, log: bool) -> list[Violation]:
    if log:  # a call-triggered kill was logged by the driver itself, at the call
            ctl.log_fault({"index": r.index, "kind": "kill_driver", "rank": -1, "pid": child.pid,
                       "phase": "signal", "call": None, "method": None, "msg_id": None,
                       "by": "chaos"})
    child.send_signal(signal.SIGKILL)
    child.wait()
    left = resources.wait_gone(pids, bounds.exit_s)
    out = [Violation("orphan", f"worker pid {pid} is still {state} {bounds.exit_s:g} s after "
                               "the driver was killed") for pid, state in left.items()
           if state == "alive"]
    shm = [n for n in os.listdir(resources.SHM_DIR) if n.startswith(f"faultlab_{child.pid}_")]
    out += [Violation("leak", f"/dev/shm/{n} outlived the killed driver") for n in shm]
    for pid in left:
        _reap_orphan(pid)
    return out


def _reap_orphan(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)  # do not leave a broken executor's orphans behind
    except (ProcessLookupError, PermissionError):
        pass


# ---------------------------------------------------------------- the driver subprocess


def _child_main(spec_path: str) -> None:
    import telemetry
    from chaos.scenario import install_in_workers

    spec = cloudpickle.loads(Path(spec_path).read_bytes())
    telemetry.configure_process("driver")
    ctl = ControlDir(os.environ[ENV_VAR])
    resolved = [r for r in ctl.read_plan()
                if not (r.fault.kind == "kill_driver" and r.at_s is not None)]
    ex = spec["cls"](spec["cfg"])
    install_in_workers(ex, spec["cfg"], ctl)
    injector = Injector(ctl, resolved, kill_driver=_ask_to_be_killed)
    points.install("driver", None, str(ctl.path))
    points.CallCounter(ctl, resolved, injector.fire).enable()
    _say("started " + json.dumps(list(ex.worker_pids)))
    injector.start(list(ex.worker_pids))
    try:
        spec["workload"](RecordingExecutor(ex))
    except Exception:  # noqa: BLE001 - the workload's errors do not matter here
        pass
    injector.stop()
    ex.shutdown()
    _say("done")


def _ask_to_be_killed() -> None:
    _say("kill")
    time.sleep(30)  # the chaos process SIGKILLs us right here, mid-call


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    _child_main(sys.argv[1])
