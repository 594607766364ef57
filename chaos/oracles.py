"""Invariant oracles: small functions over a recorded run, each returning its violations.

    RunRecord (calls, fault timeline, callbacks, shutdown time, leaks)
        ├─ results_correct      right result, or a documented error; every future resolved
        ├─ deadlines_met        no call outlives its deadline plus slack
        ├─ failure_detected     a fatal fault is detected within its bound
        ├─ callback_once        the failure callback ran at most once
        ├─ futures_in_order     calls resolve in submission order
        ├─ nothing_leaked       no process, segment, descriptor or thread left
        ├─ shutdown_bounded     shutdown() returned within its bound
        ├─ never_hung           the workload finished
        ├─ outcome_matches      what happened is what the outcome table says
        ├─ fault_free_stays_fault_free   no fault fired: every call ends as its request
        │                       asks and the executor never fails (a failure nothing
        │                       planned is a finding, never a pass)
        ├─ planned_faults_fired every planned fault fired, unless declared may_not_fire
        ├─ damage_has_a_cause   a queue found damaged had a corrupt_queue fault fire (any
                                other "damaged" verdict is the queue's own false alarm)
        └─ chaos.edge_oracles   the edges of its use: declared call outcomes,
                                Ctrl-C, forks, back-pressure, a callback on every failure

A timed-out or killed call "may or may not have happened": it is never wrong to raise a
documented error, only to return a wrong value, an undocumented error, or too late.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from chaos import edge_oracles, recording
from chaos.outcomes import Outcome
from chaos.recording import UNKNOWN, CallRecord
from chaos.run_record import Bounds, RunRecord, Violation  # Bounds: also re-exported

DOCUMENTED_ERRORS = frozenset({
    "ExecutorFailedError", "WorkerError", "CorruptMessageError", "TimeoutError",
    "QueueFullError", "ReplyUnpicklingError", "RequestPicklingError",
})
# Raised by collective_rpc itself before the call joined the queue: it has no place in line;
# nor has a call a Ctrl-C ended where it landed (its caller gave it up, as at a deadline).
_NEVER_QUEUED = ("QueueFullError", "RequestPicklingError", "KeyboardInterrupt")


Oracle = Callable[[RunRecord], list[Violation]]


def results_correct(run: RunRecord) -> list[Violation]:
    out = []
    interrupted = any(f["kind"] == "interrupt_driver" for f in run.faults)
    for c in run.calls:
        where = f"call {c.index} {c.method}{_args(c)}"
        if c.expect_errors is not None or (interrupted and c.error_type == "KeyboardInterrupt"):
            continue  # judged by edge_oracles.declared_outcomes / interrupts_contained
        if c.outcome == "pending" and c.non_block:
            out.append(Violation("results", f"{where}: its future never resolved"))
        elif c.outcome == "error" and c.error_type not in DOCUMENTED_ERRORS:
            out.append(Violation("results", f"{where} raised undocumented {c.error_type}: {c.error}"))
        elif c.outcome == "ok" and c.method == "fail":
            out.append(Violation("results", f"{where} returned {c.value!r} instead of raising"))
        elif c.outcome == "ok" and c.expected is not UNKNOWN and c.value != c.expected:
            out.append(Violation("results", f"{where} returned {_short(c.value)}, "
                                            f"expected {_short(c.expected)}"))
    return out


def deadlines_met(run: RunRecord) -> list[Violation]:
    out = []
    slack = run.bounds.deadline_slack_s
    for c in run.calls:
        if c.deadline is None or c.end is None or (c.non_block and c.waited_at is None):
            continue
        if c.end > deadline_bound(c, run.bounds):
            out.append(Violation("deadline", (
                f"call {c.index} {c.method}{_args(c)} with timeout {c.timeout:g} s ended after "
                f"{c.end - c.start:.3f} s (outcome {c.outcome} {c.error_type}), beyond its "
                f"deadline plus {slack:g} s")))
    return out


def deadline_bound(c: CallRecord, bounds: Bounds) -> float:
    """The latest a call with a deadline may end (monotonic): its deadline, or the moment the
    workload first waited on its future if later (a future is not timed before it is asked),
    plus the slack of a shared machine."""
    assert c.deadline is not None
    return max(c.deadline, c.waited_at or c.start) + bounds.deadline_slack_s


def failure_detected(run: RunRecord) -> list[Violation]:
    fatal = run.fatal_faults()
    if not fatal:
        return []
    fault_ns = fatal[0]["time_ns"]
    detected = _detection_ns(run, fault_ns)
    where = f"node {fatal[0]['node']}" if "node" in fatal[0] else f"rank {fatal[0]['rank']}"
    what = f"{fatal[0]['kind']} of {where} (pid {fatal[0].get('pid')})"
    if detected is None:
        return [Violation("detection", f"{what} was never detected: no failure callback, "
                                       "no ExecutorFailedError, executor not failed")]
    latency = (detected - fault_ns) / 1e9
    if latency > run.bounds.detect_s:
        return [Violation("detection", f"{what} was detected after {latency:.3f} s, "
                                       f"beyond the {run.bounds.detect_s:g} s bound")]
    return []


def _detection_ns(run: RunRecord, since_ns: int) -> int | None:
    times = [t for t in run.callback_times_ns if t >= since_ns]
    times += [c.end_ns for c in run.calls
              if c.error_type == "ExecutorFailedError" and c.end_ns and c.end_ns >= since_ns]
    if run.failed_at_ns is not None:
        times.append(run.failed_at_ns)
    return min(times) if times else None


def detection_latency_s(run: RunRecord) -> float | None:
    fatal = run.fatal_faults()
    if not fatal:
        return None
    detected = _detection_ns(run, fatal[0]["time_ns"])
    return None if detected is None else (detected - fatal[0]["time_ns"]) / 1e9


def callback_once(run: RunRecord) -> list[Violation]:
    n = len(run.callback_times_ns)
    if n > 1:
        return [Violation("callback", f"the failure callback ran {n} times, not at most once")]
    return []


def futures_in_order(run: RunRecord) -> list[Violation]:
    """Calls resolve in submission order; a call that timed out may leave earlier ones behind."""
    seen = [c for c in run.calls if c.resolved_seq is not None and c.error_type != "TimeoutError"
            and c.check != "callbacks"  # a call made inside a done-callback nests in another
            and c.error_type not in _NEVER_QUEUED]
    out = []
    for earlier, later in itertools.pairwise(seen):
        if later.resolved_seq < earlier.resolved_seq:  # type: ignore[operator]
            out.append(Violation("order", (
                f"call {later.index} {later.method} resolved before call {earlier.index} "
                f"{earlier.method}, which was submitted first")))
    return out


def nothing_leaked(run: RunRecord) -> list[Violation]:
    return [Violation("leak", problem) for problem in run.leaks]


def shutdown_bounded(run: RunRecord) -> list[Violation]:
    if run.shutdown_s is not None and run.shutdown_s > run.shutdown_bound_s:
        return [Violation("shutdown", f"shutdown() took {run.shutdown_s:.3f} s, beyond "
                                      f"its {run.shutdown_bound_s:g} s bound")]
    return []


def never_hung(run: RunRecord) -> list[Violation]:
    if run.hung:
        return [Violation("hang", f"the workload did not finish within "
                                  f"{run.bounds.workload_s:g} s; the executor was shut down")]
    return []


def outcome_matches(run: RunRecord) -> list[Violation]:
    """An explicit expectation holds even when no fault fired (then it usually does not)."""
    if run.expected is None or run.expected == Outcome.FAULT_FREE:
        return []  # FAULT_FREE: fault_free_stays_fault_free judges it
    seen = observed_outcome(run)
    ok = seen == run.expected or (run.expected == Outcome.DEADLINE and seen == Outcome.RECOVER
                                  and not _hit_had_deadline(run)) \
        or (run.expected == Outcome.INTERRUPT and seen == Outcome.RECOVER)  # between calls
    if ok:
        return []
    return [Violation("outcome", f"expected {run.expected.value}, observed {seen.value} "
                                 f"(errors: {sorted({c.error_type for c in run.calls} - {''})})")]


def observed_outcome(run: RunRecord) -> Outcome:
    """The strongest sign first: a failure, a Ctrl-C, a deadline; then ERROR_RECOVER if any
    call raised an error it did not ask for (wherever it stands in the run), else RECOVER.
    An error a call asked for (a ``fail`` call's WorkerError, an error a call declared) is
    the workload's own, not the fault's: it makes no run ERROR_RECOVER."""
    errors = {c.error_type for c in run.calls if c.outcome == "error"}
    failed = run.failed_at_ns is not None or bool(run.callback_times_ns) \
        or "ExecutorFailedError" in errors
    if failed:
        return Outcome.FAIL_FAST
    if "KeyboardInterrupt" in errors:
        return Outcome.INTERRUPT
    if "TimeoutError" in errors:
        return Outcome.DEADLINE
    return Outcome.ERROR_RECOVER if any(map(_unasked_error, run.calls)) else Outcome.RECOVER


def _unasked_error(c: CallRecord) -> bool:
    return c.outcome == "error" and c.error_type != recording.requested_error(c) \
        and c.error_type not in (c.expect_errors or ())


def _hit_had_deadline(run: RunRecord) -> bool:
    return any(c.timeout is not None for c in run.calls)


def fault_free_stays_fault_free(run: RunRecord) -> list[Violation]:
    """No fault fired (or ``expect = "fault_free"`` says faults may not disturb anything), so
    nothing may go wrong: each call ends as its own request asks (``requested_error``, or as
    declared) and the executor never fails, unless a call that declared
    ``ExecutorFailedError`` asked for it.  A worker that dies by itself is a finding of the
    run, never a pass.  ``run_scenario(expected=None)`` (judge no outcome) opts out."""
    if run.expected != Outcome.FAULT_FREE or run.hung:
        return []  # a hang is never_hung's; the watchdog's shutdown then fails the calls
    when = "with no fault fired" if not run.faults else "in a run expected fault_free"
    out = [Violation("fault_free", f"call {c.index} {c.method}{_args(c)} raised {c.error_type} "
                                   f"{when}: {c.error[:200]}")
           for c in run.calls if _not_as_requested(c)]
    failure = _unrequested_failure(run, when)
    return out + ([Violation("fault_free", failure)] if failure else [])


def _not_as_requested(c: CallRecord) -> bool:
    """An error the call did not ask for (ExecutorFailedError: see _unrequested_failure)."""
    return (c.expect_errors is None and c.outcome == "error"
            and not recording.timed_out_as_requested(c)
            and c.error_type not in ("ExecutorFailedError", recording.requested_error(c)))


def _unrequested_failure(run: RunRecord, when: str) -> str | None:
    dead = [c for c in run.calls if c.error_type == "ExecutorFailedError"]
    seen = run.callback_times_ns + [c.end_ns for c in dead if c.end_ns is not None]
    failed_ns = min(seen + ([run.failed_at_ns] if run.failed_at_ns is not None else []),
                    default=None)
    if failed_ns is None and not run.workers_gone and not run.failed_before_shutdown:
        return None
    asked = [c for c in run.calls if "ExecutorFailedError" in (c.expect_errors or ())]
    if asked and (failed_ns is None or failed_ns >= asked[0].start_ns):
        return None  # the workload ended the workers on purpose (and said so)
    why = run.failed_before_shutdown or (dead[0].error if dead else "") \
        or "; ".join(run.workers_gone) or "the failure callback ran"
    return (f"the executor failed {when}: {why[:300]} ({len(dead)} call(s) "
            "raised ExecutorFailedError; a run meant to fail says so: expect = \"fail_fast\", "
            "or a call declaring ExecutorFailedError)")


def planned_faults_fired(run: RunRecord) -> list[Violation]:
    """A planned fault that never fired tested nothing: reported, unless declared
    ``may_not_fire`` (e.g. a small probability over a few calls)."""
    fired = {f["index"] for f in run.faults}
    return [Violation("unfired", f"planned fault {p['index']} ({p['kind']} of {p['target']}, "
                                 f"{p['trigger']}) never fired, so the run tested nothing of it; "
                                 "declare may_not_fire = true on the fault if that is intended")
            for p in run.planned if p["index"] not in fired and not p.get("may_not_fire")]



# How the executor words a damaged ring (QueueCorruptedError, a worker's exit cause).
DAMAGE_WORDS = ("cannot be trusted", "found its shared-memory queue damaged")


def damage_has_a_cause(run: RunRecord) -> list[Violation]:
    """Only ``corrupt_queue`` damages a ring: a damage verdict with none fired is a false
    alarm of the queue's own checks (a healthy reader blamed: chaos.mutants.ProgressOneAhead),
    whatever else fired; the outcome oracle would see it too, but explore ignores outcomes."""
    if any(f["kind"] == "corrupt_queue" for f in run.faults):
        return []
    texts = [run.failed_before_shutdown or "", *(c.error for c in run.calls)]
    said = next((t for t in texts if any(w in t for w in DAMAGE_WORDS)), None)
    if said is None:
        return []
    return [Violation("damage", f"a queue was found damaged with no corrupt_queue fault fired: "
                                f"{said[:300]}")]


ALL_ORACLES: tuple[Oracle, ...] = (
    results_correct, deadlines_met, failure_detected, callback_once, futures_in_order,
    nothing_leaked, shutdown_bounded, never_hung, outcome_matches, fault_free_stays_fault_free,
    planned_faults_fired, damage_has_a_cause, *edge_oracles.ORACLES,
)


def check(run: RunRecord, oracles: tuple[Oracle, ...] = ALL_ORACLES) -> list[Violation]:
    return [v for oracle in oracles for v in oracle(run)]


def _args(c: CallRecord) -> str:
    return "(" + ", ".join(_short(a) for a in c.args) + ")"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
