"""Oracles for the edges of the executor's use (hostile values, Ctrl-C, fork, backpressure,
callbacks, deaths reaped by others), issue 11: each returns its violations.

    RunRecord ─┬─ declared_outcomes     a call the workload declared (hostile values, callbacks,
               │                        resource exhaustion) ended as declared
               ├─ interrupts_contained  Ctrl-C reached the caller as KeyboardInterrupt, and the
               │                        executor stayed up and in step
               ├─ fork_contained        a forked child of the driver changed nothing in the
               │                        parent; its own call raised a clear error
               ├─ backpressure_honest   no QueueFullError while every reader was reading
               ├─ callbacks_on_failure  every failure ran the callbacks; a late one runs at once
               └─ deaths_named          a dead worker is named (rank, pid) and never "still running",
                                        whoever reaped it (outside_reaper faults)

The invariant of each violation names the class of fault ("hostile", "interrupt", "fork",
"backpressure", "callback", ...) so a report says at once what broke.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from chaos.faults import kinds_where
from chaos.recording import UNKNOWN, CallRecord, timed_out_as_requested
from chaos.run_record import RunRecord, Violation

# Errors a "*" in expect_errors does not cover: the executor died, a hang, or a signal.
_NOT_ANY = frozenset({"ExecutorFailedError", "TimeoutError", "KeyboardInterrupt", "SystemExit",
                      "QueueFullError"})
# Fault kinds that stop a reader: only they may fill a queue for good.
_STOP_READERS = frozenset(kinds_where(stops_readers=True))
_FATAL_KINDS = frozenset(kinds_where(fatal=True))


def declared_outcomes(run: RunRecord) -> list[Violation]:
    fatal = any(f["kind"] in _FATAL_KINDS for f in run.faults)
    out = []
    for c in run.calls:
        if c.expect_errors is None:
            continue
        problem = _judge_declared(c, c.expect_errors, fatal)
        if problem:
            out.append(Violation(c.check or "declared", f"call {c.index} {c.method}: {problem}"))
    return out


def _judge_declared(c: CallRecord, allowed: frozenset[str], fatal: bool) -> str | None:
    if c.outcome == "pending":
        return "never resolved" if c.non_block else "did not finish"
    if c.outcome == "ok":
        if "ok" not in allowed:
            return f"returned {_short(c.value)} instead of raising one of {sorted(allowed - {'ok'})}"
        if c.expected is not UNKNOWN and c.value != c.expected:
            return f"returned {_short(c.value)}, expected {_short(c.expected)}"
        return None
    if c.error_type in allowed or ("*" in allowed and c.error_type not in _NOT_ANY):
        return None
    if fatal and c.error_type == "ExecutorFailedError":
        return None
    want = "its own result" if allowed == {"ok"} else f"one of {sorted(allowed)}"
    return f"raised {c.error_type}: {c.error[:200]} (expected {want})"


def interrupts_contained(run: RunRecord) -> list[Violation]:
    hits = [f for f in run.faults if f["kind"] == "interrupt_driver"]
    if not hits or any(f["kind"] != "interrupt_driver" for f in run.faults):
        return []  # other faults may fail calls in their own right
    out = []
    for f in hits:
        # A SIGINT reaches the caller, not a future it holds: an outstanding non_block call
        # ends in its own outcome (judged by results_correct), even a WorkerError.
        during = [c for c in run.calls if c.start_ns <= f["time_ns"] <= (c.end_ns or 2**63)
                  and not (c.non_block and c.error_type != "KeyboardInterrupt")]
        out += [Violation("interrupt", f"call {c.index} {c.method} was interrupted by SIGINT "
                                       f"but raised {c.error_type}: {c.error[:200]}")
                for c in during if c.outcome == "error" and c.error_type != "KeyboardInterrupt"]
    if run.failed_before_shutdown:
        out.append(Violation("interrupt", "the executor failed after a SIGINT to the driver: "
                                          f"{run.failed_before_shutdown[:300]}"))
    last = max(f["time_ns"] for f in hits)
    reported = {c.index for f in hits for c in run.calls if c.start_ns <= f["time_ns"]}
    later = [c for c in run.calls if c.start_ns > last and c.end_ns is not None
             and c.index not in reported and c.expect_errors is None]
    broken = [c for c in later if c.outcome == "error" and c.error_type != "KeyboardInterrupt"]
    out += [Violation("interrupt", f"call {c.index} {c.method}, made after the interrupt, "
                                   f"raised {c.error_type}: {c.error[:200]}") for c in broken]
    return out


def fork_contained(run: RunRecord) -> list[Violation]:
    forks = [f for f in run.faults if f["kind"] == "fork_in_driver"]
    if not forks:
        return []
    out = []
    reports = {r["index"]: r for r in run.fork_reports}
    for f in forks:
        report = reports.get(f["index"])
        if report is None:
            out.append(Violation("fork", f"the forked child of fault {f['index']} never reported"))
        elif report["outcome"] == "hung":
            out.append(Violation("fork", f"the forked child ({report['mode']}) hung: it was "
                                         "ended by its watchdog"))
        elif report["mode"] == "call":
            out += _child_call(report)
        # Under an outside reaper (outside_reaper fired too) the child's status is another's.
        reaped = report is not None and report.get("exit") == "reaped elsewhere" and any(
            r["kind"] == "outside_reaper" for r in run.faults)
        if report is not None and report.get("exit") != "exit status 0" and not reaped:
            out.append(Violation("fork", f"the forked child ({report['mode']}) did not exit "
                                         f"cleanly: {report.get('exit')} (its watchdog ends a "
                                         "child stuck in its exit handlers with status 3)"))
    alone = all(f["kind"] == "fork_in_driver" for f in run.faults)
    if alone and run.failed_before_shutdown:
        out.append(Violation("fork", "the parent's executor failed after a forked child of the "
                                     f"driver: {run.failed_before_shutdown[:300]}"))
    if alone:
        out += [Violation("fork", f"{gone}, though only a forked child of the driver acted")
                for gone in run.workers_gone]
    return out


def _child_call(report: dict[str, Any]) -> list[Violation]:
    if report["outcome"] == "ok":
        return [Violation("fork", "a forked child called the inherited executor and got "
                                  f"{report.get('value')} (it must raise a clear error)")]
    if report.get("error_type") in ("TimeoutError", "QueueFullError"):
        return [Violation("fork", "a forked child's call on the inherited executor raised "
                                  f"{report['error_type']} ({report.get('error')}), not a clear "
                                  "error saying the executor belongs to another process")]
    return []


def backpressure_honest(run: RunRecord) -> list[Violation]:
    """No QueueFullError while every reader reads, unless the call asked to time out (a
    deadline shorter than its own work may pass while the readers serve the calls ahead)."""
    if any(f["kind"] in _STOP_READERS for f in run.faults):
        return []
    return [Violation("backpressure", f"call {c.index} {c.method} raised QueueFullError although "
                                      f"every reader was reading: {c.error[:200]}")
            for c in run.calls if c.error_type == "QueueFullError" and not timed_out_as_requested(c)]


def callbacks_on_failure(run: RunRecord) -> list[Violation]:
    if run.failed_before_shutdown is None:
        return []
    out = []
    if not run.callback_times_ns:
        out.append(Violation("callback", "the executor failed but no failure callback ran: "
                                         f"{run.failed_before_shutdown[:300]}"))
    if run.late_callback_ran is False:
        out.append(Violation("callback", "a failure callback registered on the failed executor "
                                         "was not called at once"))
    return out


# Kinds that end a worker process (it is gone, not just failing a call).
_DEATHS = frozenset(kinds_where(target="worker", fatal=True, stops_readers=True))


def deaths_named(run: RunRecord) -> list[Violation]:
    failure = run.failed_before_shutdown
    if failure is None:
        return []
    out = []
    if "still running" in failure:
        out.append(Violation("death", f"a dead worker was reported as still running: {failure[:300]}"))
    fatal = run.fatal_faults()
    if len(fatal) == 1 and fatal[0]["kind"] in _DEATHS and fatal[0].get("pid"):
        name = f"rank {fatal[0]['rank']} (pid {fatal[0]['pid']})"
        if str(fatal[0]["pid"]) not in failure:  # local: "rank r (pid p)"; remote: "(pid [p])"
            out.append(Violation("death", f"the failure does not name the dead worker, {name}: "
                                          f"{failure[:300]}"))
    return out


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


ORACLES: tuple[Callable[[RunRecord], list[Violation]], ...] = (
    declared_outcomes, interrupts_contained, fork_contained, backpressure_honest,
    callbacks_on_failure, deaths_named)
