"""What the peer targets' drivers (loky, pebble, ray) share: the workload, its loop and the
process tree by role.

    python -m chaos.targets.NAME_driver SPEC_JSON      (launch(name, spec))
      load_spec(argv)                    the WorkloadSpec, as JSON
      start the executor, one warm-up task per rank (so every worker exists)
      Reporter.ready(process_tree(...))  driver; workers by rank (role "worker"); every other
                                         process the executor started, by role (helpers)
      run_calls(spec, reporter, call)    call i = one task per rank, each ~call_s of sleep,
                                         whose value is call_value(i, rank): invoke, then ok
                                         (the values) or fail; ``error`` once, the first time
                                         the executor itself raised
      Reporter.done(); linger(spec)      the idle window in which kill_driver may hit
      shut the executor down

A call's value is a pure function of (call index, rank), so a fault-free run is checkable
without a reference and survivors of a faulted run compare equal to it.  The drivers judge
nothing: they report what the executor did, and the observer (chaos/targets/run.py) judges.

The whole run can be found again after its driver is gone (``marked_processes``): every
process inherits ``MARKER_ENV`` (the target's launch sets it), and ``ready`` carries the
driver's session id.  Both are needed: a process that sets its title (Ray's ``ray::...``
agents and workers) overwrites its environment as /proc shows it, and a process that starts a
session of its own leaves the driver's.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import psutil

from chaos.targets.base import Launch, WorkloadSpec
from chaos.targets.protocol import Reporter, call_value

MARKER_ENV = "FAULTLAB_TARGET_MARKER"
_ROOT = str(Path(__file__).resolve().parents[2])
# A caller's own bound on one call (env FAULTLAB_PEER_CALL_TIMEOUT_S overrides): long enough
# that the observer's hang bound for a stopped worker comes first.
CALL_TIMEOUT_ENV = "FAULTLAB_PEER_CALL_TIMEOUT_S"
CALL_TIMEOUT_MIN_S = 60.0


class CallTimeout(TimeoutError):
    """The driver's own bound on a call ran out: the executor neither answered nor failed."""


def task_value(call_index: int, rank: int) -> int:
    """The same value every unit-of-work target returns (faultlab, processpool, ...)."""
    return call_value(call_index, rank)


def sleep_task(call_index: int, rank: int, call_s: float) -> int:
    """One rank's share of a call: about ``call_s`` of work, then its checkable value."""
    time.sleep(call_s)
    return task_value(call_index, rank)


def pid_task(hold_s: float) -> int:
    """A warm-up task: holds its worker ``hold_s`` so that each of a round lands on its own."""
    time.sleep(hold_s)
    return os.getpid()


def load_spec(argv: list[str]) -> WorkloadSpec:
    """The spec in ``argv[1]``: its JSON (as the targets' launch passes it) or a JSON file's
    path; unknown keys are ignored."""
    if len(argv) != 2:
        raise SystemExit(f"usage: {argv[0]} SPEC_JSON")
    text = argv[1]
    if not text.lstrip().startswith("{"):
        with open(text, encoding="utf-8") as stream:
            text = stream.read()
    data = json.loads(text)
    known = {f.name for f in dataclasses.fields(WorkloadSpec)}
    return WorkloadSpec(**{k: v for k, v in data.items() if k in known})


def call_timeout_s(spec: WorkloadSpec) -> float:
    override = os.environ.get(CALL_TIMEOUT_ENV)
    if override:
        return float(override)
    return max(CALL_TIMEOUT_MIN_S, 20 * spec.call_s)


def gather(futures: Sequence[concurrent.futures.Future[int]], timeout_s: float,
           executor: str) -> list[int]:
    """The futures' values in order; raises the first failure as soon as it happens (not
    after the tasks before it end: detection latency is the executor's, not our wait's), or
    CallTimeout when ``timeout_s`` runs out first."""
    done, pending = concurrent.futures.wait(futures, timeout=timeout_s,
                                            return_when=concurrent.futures.FIRST_EXCEPTION)
    for future in futures:
        failure = future.exception() if future in done else None
        if failure is not None:
            raise failure
    if pending:
        raise CallTimeout(f"{len(pending)} of {len(futures)} tasks had no answer from "
                          f"{executor} within {timeout_s}s")
    return [future.result() for future in futures]


def run_calls(spec: WorkloadSpec, reporter: Reporter, call: Callable[[int], list[int]]) -> None:
    """Run ``spec.calls`` calls through ``call`` (raises what the executor raised, or
    CallTimeout), reporting each one; the loop goes on after a failure, to show recovery."""
    for index in range(spec.calls):
        reporter.invoke(index, f"{spec.ranks} tasks of {spec.call_s}s")
        try:
            values = call(index)
        except CallTimeout as exc:
            reporter.fail(index, exc)
        except Exception as exc:  # noqa: BLE001 - whatever the executor raises is the finding
            reporter.fail(index, exc)
            reporter.error(exc)
        else:
            reporter.ok(index, values)


def linger(spec: WorkloadSpec) -> None:
    if spec.linger_s > 0:
        time.sleep(spec.linger_s)


def entry(role: str, rank: int | None, pid: int, **extra: Any) -> dict[str, Any]:
    return {"role": role, "rank": rank, "pid": pid, **extra}


def process_tree(workers: list[int], helpers: Iterable[psutil.Process],
                 role_of: Callable[[psutil.Process], str]) -> list[dict[str, Any]]:
    """The driver, ``workers`` as ranks 0..n-1 in the given order, then every helper by the
    role ``role_of`` names (its command line is kept, cut short, to say what it is)."""
    tree = [entry("driver", None, os.getpid())]
    tree += [entry("worker", rank, pid) for rank, pid in enumerate(workers)]
    for proc in sorted(helpers, key=lambda p: p.pid):
        if proc.pid in workers:
            continue
        try:
            tree.append(entry(role_of(proc), None, proc.pid, cmd=_short_cmdline(proc)))
        except psutil.Error:
            continue
    return tree


def descendants() -> list[psutil.Process]:
    """This process's live descendants (zombies left out)."""
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def _short_cmdline(proc: psutil.Process) -> str:
    return " ".join(proc.cmdline())[:160]


def cmdline_text(proc: psutil.Process) -> str:
    """``proc``'s command line as one string; empty when it cannot be read."""
    try:
        return " ".join(proc.cmdline())
    except psutil.Error:
        return ""


def marked_processes(marker: str, session: int | None = None) -> list[psutil.Process]:
    """Every live process of a run (this one aside): its environment carries
    ``MARKER_ENV=marker``, or it is in session ``session`` (the driver's, when the driver was
    started in a session of its own).  Both, because a process that sets its title (Ray's
    ``ray::...`` agents and workers) overwrites its environment as /proc shows it."""
    found = []
    for proc in psutil.process_iter():
        if proc.pid == os.getpid():
            continue
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and _is_marked(proc, marker, session):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def _is_marked(proc: psutil.Process, marker: str, session: int | None) -> bool:
    if session is not None:
        try:
            if os.getsid(proc.pid) == session:
                return True
        except OSError:
            pass
    return bool(proc.environ().get(MARKER_ENV) == marker)


def kill_marked(marker: str, session: int | None = None, wait_s: float = 5.0) -> list[psutil.Process]:
    """SIGKILL every process of the run (``marked_processes``), wait for them; returns them."""
    procs = marked_processes(marker, session)
    for proc in procs:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=wait_s)
    return procs


def report_ready(reporter: Reporter, tree: list[dict[str, Any]], started: float,
                 **info: Any) -> None:
    """``ready`` with what finds the run again from outside: the marker, the session."""
    reporter.ready(tree, marker=os.environ.get(MARKER_ENV), sid=os.getsid(0),
                   start_s=round(time.monotonic() - started, 3), **info)


def launch(name: str, spec: WorkloadSpec) -> Launch:
    """``python -m chaos.targets.NAME_driver SPEC_JSON`` with this venv's interpreter (the
    peers are this project's extra) and this checkout first on the path, in the observer's
    environment plus a fresh ``MARKER_ENV`` (the shape of faultlab_target.python_launch)."""
    path = os.pathsep.join(p for p in (_ROOT, os.environ.get("PYTHONPATH", "")) if p)
    marker = f"{name}-{os.getpid()}-{time.monotonic_ns()}"
    env = dict(os.environ, PYTHONPATH=path, PYTHONUNBUFFERED="1", **{MARKER_ENV: marker})
    env.pop("FAULTLAB_TRACE_DIR", None)  # the driver's journal is not the observer's
    argv = [sys.executable, "-m", f"chaos.targets.{name}_driver", json.dumps(spec.to_json())]
    return Launch(argv, env, _ROOT)


def expected_values(spec: WorkloadSpec) -> dict[int, Any]:
    """Every call's fault-free value: each rank's ``call_value``, in rank order."""
    return {i: [task_value(i, r) for r in range(spec.ranks)] for i in range(spec.calls)}
