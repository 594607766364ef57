"""``run_scenario``: start an executor, run a workload under a fault plan, check invariants.

    plan.resolve(seed) ─► ctl/plan.json ─► workers install their failpoints (chaos.points)
    MultiprocExecutor ─► RecordingExecutor ─► workload(ex)   (in a thread, with a watchdog)
         ▲ CallCounter (driver failpoints)      Injector (timer thread: signals, helpers)
    shutdown ─► leak snapshot ─► fault timeline ─► oracles ─► ScenarioResult (+ result.json)

Expected outcome "auto": the outcome table's for the faults that fired, or ``FAULT_FREE`` when
none did (then nothing may fail).  A planned fault that never fired is a violation
("unfired") unless its index is in ``may_not_fire``.

A plan with ``KillDriver`` runs the driver in a subprocess instead (``chaos.driver_run``).
With ``cfg.nnodes > 1`` the agents of nodes 1.. start just before the executor (``chaos.nodes``,
loopback, a fresh secret in out/nodes/); they must be gone after shutdown, else a leak.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import threading
import time
from collections import Counter
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import telemetry
from chaos import interrupts, points, resources, surroundings
from chaos.control import ENV_VAR, ControlDir
from chaos.environ import restored_environ
from chaos.injector import Injector
from chaos.nodes import RemoteNodes
from chaos.oracles import (
    Bounds,
    RunRecord,
    Violation,
    check,
    detection_latency_s,
    fault_free_stays_fault_free,
    observed_outcome,
    planned_faults_fired,
)
from chaos.outcomes import Outcome, combined_outcome, outcome_for
from chaos.plan import FaultPlan, ResolvedFault
from chaos.recording import CallRecord, RecordingExecutor
from chaos.workloads import Workload
from executor import ExecutorConfig, MultiprocExecutor, failpoints
from executor.launch import make_context
from executor.surfaces import ExecutorLike


@dataclasses.dataclass(kw_only=True)
class ScenarioResult:
    name: str
    seed: int
    violations: list[Violation]
    trace_dir: Path
    out_dir: Path
    calls: list[CallRecord]
    faults: list[dict[str, Any]]  # the fault timeline, every process, in time order
    fired_points: dict[str, int]
    expected: Outcome | None
    outcome: Outcome | None
    detection_latency_s: float | None
    shutdown_s: float | None
    wall_s: float
    unfired: list[int]  # indices of planned faults that never fired
    error: str = ""  # a scenario that could not run (e.g. the executor did not start)
    may_not_fire: list[int] = dataclasses.field(default_factory=list)  # declared so: no violation

    @property
    def ok(self) -> bool:
        return not self.violations

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "seed": self.seed, "ok": self.ok,
            "violations": [{"invariant": v.invariant, "message": v.message} for v in self.violations],
            "trace_dir": str(self.trace_dir), "calls": [c.summary() for c in self.calls],
            "faults": self.faults, "fired_points": self.fired_points,
            "expected": self.expected and self.expected.value,
            "outcome": self.outcome and self.outcome.value,
            "detection_latency_s": self.detection_latency_s, "shutdown_s": self.shutdown_s,
            "wall_s": round(self.wall_s, 4), "unfired": self.unfired, "error": self.error,
            "may_not_fire": self.may_not_fire,
        }


def run_scenario(
    cfg: ExecutorConfig, workload: Workload, plan: FaultPlan, out_dir: str | os.PathLike[str],
    *, name: str = "scenario", expected: Outcome | str | None = "auto",
    bounds: Bounds | None = None, executor_class: type = MultiprocExecutor,
    may_not_fire: Collection[int] = (),
) -> ScenarioResult:
    """Run ``workload(executor)`` under ``plan``; see the module docstring.  ``may_not_fire``:
    indices of planned faults that may legitimately never fire (no "unfired" violation)."""
    out = Path(out_dir)
    for stale in ("ctl", "trace"):  # a rerun into the same directory starts clean
        shutil.rmtree(out / stale, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    bounds = bounds or Bounds()
    interrupts.check_main_thread(plan, workload)
    (out / "plan.json").write_text(json.dumps(
        {"name": name, "plan": plan.to_dict(), "config": _config_dict(cfg)}, indent=2, default=str))
    if plan.kills_driver:
        from chaos.driver_run import run_with_driver_process

        result = run_with_driver_process(cfg, workload, plan, out, name, bounds, executor_class)
        result.violations += planned_faults_fired(RunRecord(
            calls=[], faults=result.faults, planned=planned_faults(plan.resolve(), may_not_fire)))
    else:
        result = _InProcessRun(cfg, workload, plan, out, name, bounds, executor_class,
                               may_not_fire).run(expected)
    result.may_not_fire = sorted(set(may_not_fire))
    (out / "result.json").write_text(json.dumps(result.to_dict(), indent=2, default=str))
    return result


def _config_dict(cfg: ExecutorConfig) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


@contextmanager
def scenario_environment(trace_dir: Path, ctl_dir: Path) -> Iterator[None]:
    """Point tracing and failpoint installation at this scenario; restore afterwards."""
    try:
        with restored_environ((telemetry_env(), ENV_VAR, failpoints.ENV_VAR)):
            os.environ.update({telemetry_env(): str(trace_dir), ENV_VAR: str(ctl_dir),
                               failpoints.ENV_VAR: points.INSTALLER})
            telemetry.configure_process("driver")
            yield
    finally:
        telemetry.configure_process("driver")  # once the variables are back


def telemetry_env() -> str:
    from telemetry.config import TRACE_DIR_ENV

    return TRACE_DIR_ENV


def prepare_forkserver(cfg: ExecutorConfig) -> None:
    """Start the forkserver before our variables are set: it would keep them for good."""
    if cfg.resolved_start_method() == "forkserver":
        import multiprocessing.forkserver as fs

        make_context("forkserver")
        fs.ensure_running()


def install_in_workers(ex: ExecutorLike, cfg: ExecutorConfig, ctl: ControlDir) -> None:
    """forkserver workers do not see the driver's environment: install through an RPC."""
    if cfg.resolved_start_method() == "forkserver":
        ex.collective_rpc(points.install_in_worker, args=(str(ctl.path),), timeout=30)


def annotate(timeline: list[dict[str, Any]], resolved: list[ResolvedFault]) -> list[dict[str, Any]]:
    """Mark each fault record with the outcome the table expects of it."""
    for record in timeline:
        outcome = outcome_for(resolved[record["index"]].fault)
        record["expected"] = outcome.value
        record["fatal"] = outcome == Outcome.FAIL_FAST
        if hasattr(resolved[record["index"]].fault, "queue"):  # corrupt_queue: rpc or reply
            record["queue"] = resolved[record["index"]].fault.queue
    return timeline


def fired_points(timeline: list[dict[str, Any]], resolved: list[ResolvedFault]) -> dict[str, int]:
    fired = Counter(points.point_of(resolved[r["index"]]) for r in timeline if r["by"] == "failpoint")
    return dict(sorted(fired.items()))


def expected_outcome(expected: Outcome | str | None, timeline: list[dict[str, Any]],
                     resolved: list[ResolvedFault]) -> Outcome | None:
    if expected != "auto":
        return Outcome(expected) if expected is not None else None
    hit = sorted({r["index"] for r in timeline})
    return combined_outcome([resolved[i].fault for i in hit]) or Outcome.FAULT_FREE


def planned_faults(resolved: list[ResolvedFault], may_not_fire: Collection[int]) -> list[dict[str, Any]]:
    """Each planned fault, in words, for the ``planned_faults_fired`` oracle."""
    return [{"index": r.index, "kind": r.fault.kind, "target": _target(r),
             "trigger": _trigger(r), "may_not_fire": r.index in may_not_fire} for r in resolved]


def _target(r: ResolvedFault) -> str:
    node = getattr(r.fault, "node", None)
    return f"node {node}" if node is not None else f"rank {r.fault.rank}"


def _trigger(r: ResolvedFault) -> str:
    if r.at_s is not None:
        return f"due {r.at_s:.3f} s after the workload started"
    first = min(r.calls, default=None)
    if r.fault.probability is not None:
        return (f"with probability {r.fault.probability:g} per call of {r.method!r}, first "
                f"drawn call {first}")
    return f"on call {first} of {r.method!r}"


class _InProcessRun:
    def __init__(self, cfg: ExecutorConfig, workload: Workload, plan: FaultPlan, out: Path,
                 name: str, bounds: Bounds, executor_class: type,
                 may_not_fire: Collection[int] = ()) -> None:
        self.cfg, self.workload, self.plan, self.out = cfg, workload, plan, out
        self.name, self.bounds, self.executor_class = name, bounds, executor_class
        self.trace_dir, self.ctl = out / "trace", ControlDir(out / "ctl")
        self.resolved = plan.resolve()
        self.planned = planned_faults(self.resolved, may_not_fire)
        self.hung = False

    def run(self, expected: Outcome | str | None) -> ScenarioResult:
        t0 = time.monotonic()
        self.ctl.write_plan(self.resolved, self.plan.seed)
        (self.ctl.path / "driver.pid").write_text(str(os.getpid()))  # for mid_reply SIGINTs
        prepare_forkserver(self.cfg)
        with scenario_environment(self.trace_dir, self.ctl.path), \
                RemoteNodes(self.cfg, self.out / "nodes") as nodes:
            before = resources.snapshot()
            nodes.start()
            try:
                ex = self.executor_class(nodes.config)
            except Exception as exc:  # noqa: BLE001 - reported as the scenario's failure
                return self._not_started(exc, t0)
            try:  # a forkserver run's first call: a broken executor may fail it
                install_in_workers(ex, self.cfg, self.ctl)
            except Exception as exc:  # noqa: BLE001 - reported as the scenario's failure
                ex.shutdown()
                return self._not_started(exc, t0)
            record = self._drive(ex, before, nodes)
        return self._result(record, expected, time.monotonic() - t0)

    def _drive(self, ex: ExecutorLike, before: resources.Snapshot, nodes: RemoteNodes) -> RunRecord:
        pids = list(ex.worker_pids)
        proxy = RecordingExecutor(ex)
        injector = Injector(self.ctl, self.resolved, node_tree=nodes.tree_pids)
        injector.executor = ex
        points.install("driver", None, str(self.ctl.path))
        points.CallCounter(self.ctl, self.resolved, injector.fire).enable()
        with self._sigint() as sigint:
            injector.start(pids)
            try:
                self._run_workload(proxy, sigint)
                failed_at = self._await_detection(ex, proxy)
            finally:
                injector.stop()
                failpoints.disable()  # every point chaos switched on in the driver
            after = self._before_shutdown(ex, proxy, pids)
            started = time.monotonic()
            try:
                ex.shutdown()
            finally:
                shutdown_s = time.monotonic() - started
                surroundings.end_outside_reapers()  # outside_reaper faults: shutdown ran under them
        surroundings.end_strays(self.ctl.path)
        nodes.wait_exit(self.bounds.exit_s)
        leaks = resources.leaks(before, pids, os.getpid(), (str(self.out),))
        return RunRecord(**after,
            calls=proxy.calls, faults=annotate(self.ctl.timeline(), self.resolved),
            callback_times_ns=proxy.callback_times_ns, failed_at_ns=failed_at,
            shutdown_s=shutdown_s, leaks=leaks, hung=self.hung, bounds=self.bounds,
            planned=self.planned,
            shutdown_bound_s=self.cfg.shutdown_grace + self.cfg.sigterm_grace
            + self.bounds.shutdown_slack_s,
        )

    def _sigint(self) -> Any:
        if interrupts.needs_main_thread(self.plan, self.workload):
            return interrupts.contained_sigint()
        return contextlib.nullcontext(None)

    def _before_shutdown(self, ex: ExecutorLike, proxy: RecordingExecutor, pids: list[int]) -> dict[str, Any]:
        """What only a live executor can tell: is it failed, did the callbacks run, are the
        workers there, and (after an interrupt) is it still in step."""
        timeline = self.ctl.timeline()
        # In step after a Ctrl-C: judged when interrupts are all that fired, and all that was
        # planned (a hung or slowed worker would time the probe out in its own right, and
        # may still be due: an interrupted call's request is sent by the next write, here
        # the probe's, and a fault armed for that call fires then; seed 393 of explore).
        planned = all(r.fault.kind == "interrupt_driver" for r in self.resolved)
        if timeline and planned and not ex.is_failed:
            interrupts.probe_in_step(proxy)
        failure = getattr(ex, "_failure", None) if ex.is_failed and not self.hung else None
        late: bool | None = None
        if failure is not None:
            grace = self.cfg.shutdown_grace + self.cfg.sigterm_grace + self.bounds.detect_s
            deadline = time.monotonic() + grace
            while not proxy.callback_times_ns and time.monotonic() < deadline:
                time.sleep(0.01)
            ran: list[bool] = []
            ex.register_failure_callback(lambda: ran.append(True))
            late = bool(ran)
        gone = [f"worker rank {r} (pid {p}) is {state} before shutdown()"
                for r, p in enumerate(pids) if (state := resources.process_state(p)) != "alive"]
        return {"failed_before_shutdown": None if failure is None else str(failure),
                "late_callback_ran": late, "workers_gone": gone,
                "fork_reports": surroundings.read_fork_reports(self.ctl.path)}

    def _run_workload(self, proxy: RecordingExecutor, sigint: Any = None) -> None:
        if sigint is not None:
            interrupts.run_on_main_thread(self.workload, proxy, sigint, self.bounds.workload_s,
                                          lambda: self._expire(proxy))
            return
        errors: list[BaseException] = []

        def target() -> None:
            try:
                self.workload(proxy)
            except Exception as exc:  # noqa: BLE001 - the calls already recorded it
                errors.append(exc)

        thread = threading.Thread(target=target, name="chaos-workload", daemon=True)
        thread.start()
        thread.join(self.bounds.workload_s)
        if thread.is_alive():
            self.hung = True
            proxy.executor.shutdown()  # wakes every waiter with ExecutorFailedError
            thread.join(10.0)

    def _expire(self, proxy: RecordingExecutor) -> None:
        self.hung = True
        proxy.executor.shutdown()  # wakes every waiter with ExecutorFailedError

    def _await_detection(self, ex: ExecutorLike, proxy: RecordingExecutor) -> int | None:
        """A fatal fault late in the workload may be detected just after it: wait a bound."""
        fatal = [r for r in annotate(self.ctl.timeline(), self.resolved) if r["fatal"]]
        deadline = time.monotonic() + (self.bounds.detect_s if fatal else 0)
        while True:
            if ex.is_failed:
                return min([time.time_ns(), *proxy.callback_times_ns])
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.01)

    def _result(self, run: RunRecord, expected: Any, wall_s: float) -> ScenarioResult:
        seen = [r for r in run.faults if not run.unread_damage(r)]  # damage no call could read
        run.expected = expected_outcome(expected, seen, self.resolved)
        violations = check(run)
        hit = {r["index"] for r in run.faults}
        return ScenarioResult(
            name=self.name, seed=self.plan.seed, violations=violations, trace_dir=self.trace_dir,
            out_dir=self.out, calls=run.calls, faults=run.faults,
            fired_points=fired_points(run.faults, self.resolved), expected=run.expected,
            outcome=_outcome(run), detection_latency_s=detection_latency_s(run),
            shutdown_s=run.shutdown_s, wall_s=wall_s,
            unfired=[r.index for r in self.resolved if r.index not in hit],
        )

    def _not_started(self, exc: Exception, t0: float) -> ScenarioResult:
        message = f"the executor did not start: {type(exc).__name__}: {exc}"
        return ScenarioResult(
            name=self.name, seed=self.plan.seed, violations=[Violation("startup", message)],
            trace_dir=self.trace_dir, out_dir=self.out, calls=[], faults=[], fired_points={},
            expected=None, outcome=None, detection_latency_s=None, shutdown_s=None,
            wall_s=time.monotonic() - t0, unfired=[r.index for r in self.resolved], error=message,
        )


def _outcome(run: RunRecord) -> Outcome:
    """What was observed; FAULT_FREE only for a fault-free run that stayed so."""
    if run.expected == Outcome.FAULT_FREE and not run.hung and not fault_free_stays_fault_free(run):
        return Outcome.FAULT_FREE
    return observed_outcome(run)
