"""Planted judges for faultlab's own run oracles (chaos.oracles, chaos.edge_oracles,
chaos.run_record, chaos.recording's request rules) and the expected-outcome table
(chaos.outcomes: outcome_for, combined_outcome).

    RunRecord ──results / deadline / detection / callback / order / leak / shutdown / outcome /
                fault_free / unfired / damage / declared / interrupt / fork / backpressure /
                callback-on-failure──► [Violation]

Each plant is one plausible slip in one of those judges: the wrong bound compared (the
detection, exit or shutdown slack in place of the right one), a slack dropped, the last
fault or the latest signal in place of the first, an off-by-one (``<= 2`` callbacks,
``>=`` a bound, ``>`` a timeout), an exemption widened (any Ctrl-C, a WorkerError with no
place in line, a failure asked for at any time, any fault as a cause of damage, any exit of
a forked child "reaped elsewhere", every fault kind fatal or stopping readers) or narrowed
(a Ctrl-C given a place in line, a documented error forgotten, a QueueFullError no longer a
timeout), a check dropped (threads, may_not_fire, the late callback, the wait on a future,
workers gone, the failure text), a precedence swapped (a deadline over a death) and a
wrong key (a planned fault matched by kind, not index); in the table, a phase or a damage
mode in the wrong class and several faults combined weakest first, or the driver's death
not dominating.
tests/judges/test_judges_oracles.py holds the fire/quiet cases that catch every one.

Invariants: plants reach judges through their module's globals (every oracle calls its
helpers and constants by name at call time; ``chaos.oracles`` reads the request rules as
``recording.requested_error``); the cases call ``oracles.X`` / ``edge_oracles.X``, so the
plant is what runs (``oracles.ALL_ORACLES`` holds the originals: ``check()`` is not planted).
Nothing here touches ``edge_oracles.deaths_named``.  Names start with ``oracles.``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from chaos import outcomes, recording
from chaos.faults import KINDS
from chaos.outcomes import Outcome
from chaos.planted_judges import PlantedJudge
from chaos.recording import CallRecord
from chaos.run_record import Bounds, RunRecord, Violation

Oracle = Callable[[RunRecord], list[Violation]]


def _bound_read_from(right: str, wrong: str) -> Callable[[Any], Oracle]:
    """The oracle as it is, but the bound ``right`` read from the field ``wrong``."""
    def make(original: Oracle) -> Oracle:
        def oracle(run: RunRecord) -> list[Violation]:
            bounds = dataclasses.replace(run.bounds, **{right: getattr(run.bounds, wrong)})
            return original(dataclasses.replace(run, bounds=bounds))
        return oracle
    return make


# -- results_correct --------------------------------------------------------------------------

def _any_ctrl_c_exempt(original: Oracle) -> Oracle:
    def results_correct(run: RunRecord) -> list[Violation]:
        # the interrupt_driver fault no longer asked for: every KeyboardInterrupt passes
        return [v for v in original(run) if "raised undocumented KeyboardInterrupt" not in v.message]
    return results_correct


# -- deadlines_met ----------------------------------------------------------------------------

def _no_slack(original: Any) -> Callable[[CallRecord, Bounds], float]:
    def deadline_bound(c: CallRecord, bounds: Bounds) -> float:
        assert c.deadline is not None
        return max(c.deadline, c.waited_at or c.start)
    return deadline_bound


def _wait_ignored(original: Any) -> Callable[[CallRecord, Bounds], float]:
    def deadline_bound(c: CallRecord, bounds: Bounds) -> float:
        assert c.deadline is not None
        return c.deadline + bounds.deadline_slack_s
    return deadline_bound


# -- failure_detected -------------------------------------------------------------------------

def _from_last_fault(original: Oracle) -> Oracle:
    def failure_detected(run: RunRecord) -> list[Violation]:
        # fatal[-1] in place of fatal[0]: the faults seen newest first
        return original(dataclasses.replace(run, faults=list(reversed(run.faults))))
    return failure_detected


def _latest_signal(original: Any) -> Callable[[RunRecord, int], int | None]:
    def _detection_ns(run: RunRecord, since_ns: int) -> int | None:
        times = [t for t in run.callback_times_ns if t >= since_ns]
        times += [c.end_ns for c in run.calls
                  if c.error_type == "ExecutorFailedError" and c.end_ns and c.end_ns >= since_ns]
        if run.failed_at_ns is not None:
            times.append(run.failed_at_ns)
        return max(times) if times else None
    return _detection_ns


def _signals_before_the_fault(original: Any) -> Callable[[RunRecord, int], int | None]:
    def _detection_ns(run: RunRecord, since_ns: int) -> int | None:
        times = list(run.callback_times_ns)
        times += [c.end_ns for c in run.calls if c.error_type == "ExecutorFailedError" and c.end_ns]
        if run.failed_at_ns is not None:
            times.append(run.failed_at_ns)
        return min(times) if times else None
    return _detection_ns


def _unread_any_queue(original: Any) -> Callable[[RunRecord, dict[str, Any]], bool]:
    def unread_damage(self: RunRecord, fault: dict[str, Any]) -> bool:
        # the queue left unchecked: damage to a request (read by the workers unasked) exempt too
        return bool(original(self, {**fault, "queue": "reply"}))
    return unread_damage


# -- callback_once, nothing_leaked, shutdown_bounded ------------------------------------------

def _twice_allowed(original: Oracle) -> Oracle:
    def callback_once(run: RunRecord) -> list[Violation]:
        n = len(run.callback_times_ns)
        if n > 2:
            return [Violation("callback", f"the failure callback ran {n} times, not at most once")]
        return []
    return callback_once


def _threads_ignored(original: Oracle) -> Oracle:
    def nothing_leaked(run: RunRecord) -> list[Violation]:
        return [Violation("leak", p) for p in run.leaks if not p.startswith("thread ")]
    return nothing_leaked


def _shutdown_slack_as_bound(original: Oracle) -> Oracle:
    def shutdown_bounded(run: RunRecord) -> list[Violation]:
        bound = run.bounds.shutdown_slack_s
        if run.shutdown_s is not None and run.shutdown_s > bound:
            return [Violation("shutdown", f"shutdown() took {run.shutdown_s:.3f} s, beyond "
                                          f"its {bound:g} s bound")]
        return []
    return shutdown_bounded


def _shutdown_at_bound_late(original: Oracle) -> Oracle:
    def shutdown_bounded(run: RunRecord) -> list[Violation]:
        if run.shutdown_s is not None and run.shutdown_s >= run.shutdown_bound_s:
            return [Violation("shutdown", f"shutdown() took {run.shutdown_s:.3f} s, beyond "
                                          f"its {run.shutdown_bound_s:g} s bound")]
        return []
    return shutdown_bounded


# -- observed_outcome, outcome_matches --------------------------------------------------------

def _deadline_over_death(original: Callable[[RunRecord], Outcome]) -> Callable[[RunRecord], Outcome]:
    def observed_outcome(run: RunRecord) -> Outcome:
        if any(c.error_type == "TimeoutError" for c in run.calls):
            return Outcome.DEADLINE  # checked before the failure: a deadline masks a death
        return original(run)
    return observed_outcome


def _callback_no_failure(original: Callable[[RunRecord], Outcome]) -> Callable[[RunRecord], Outcome]:
    def observed_outcome(run: RunRecord) -> Outcome:
        return original(dataclasses.replace(run, callback_times_ns=[]))
    return observed_outcome


def _error_recover_by_position(original: Callable[[RunRecord], Outcome]) -> Callable[[RunRecord], Outcome]:
    def observed_outcome(run: RunRecord) -> Outcome:
        seen = original(run)
        if seen not in (Outcome.ERROR_RECOVER, Outcome.RECOVER):
            return seen
        errors = {c.error_type for c in run.calls if c.outcome == "error"}
        if errors & {"WorkerError", "CorruptMessageError"} and run.calls[-1].outcome == "ok":
            return Outcome.ERROR_RECOVER
        return Outcome.RECOVER if not errors - {"WorkerError"} else Outcome.ERROR_RECOVER
    return observed_outcome


def _never_had_deadline(original: Callable[[RunRecord], bool]) -> Callable[[RunRecord], bool]:
    def _hit_had_deadline(run: RunRecord) -> bool:
        return any(c.timeout is not None and c.outcome == "error" for c in run.calls)
    return _hit_had_deadline


# -- fault_free_stays_fault_free (and the request rules it shares) ----------------------------

def _sleep_past_timeout_only(original: Any) -> Callable[[CallRecord], str | None]:
    def requested_error(call: CallRecord) -> str | None:
        if call.method == "fail":
            return "WorkerError"
        seconds = call.args[0] if call.args else None
        if (call.method == "sleep" and call.timeout is not None
                and isinstance(seconds, (int, float)) and seconds > call.timeout):
            return "TimeoutError"
        return None
    return requested_error


def _queue_full_not_a_timeout(original: Any) -> Callable[[CallRecord], bool]:
    def timed_out_as_requested(call: CallRecord) -> bool:
        return recording.requested_error(call) == "TimeoutError" and call.error_type == "TimeoutError"
    return timed_out_as_requested


def _any_timeout_requested(original: Any) -> Callable[[CallRecord], bool]:
    def _not_as_requested(c: CallRecord) -> bool:
        return bool(original(c)) and c.error_type != "TimeoutError"
    return _not_as_requested


def _asked_at_any_time(original: Any) -> Callable[[RunRecord, str], str | None]:
    def _unrequested_failure(run: RunRecord, when: str) -> str | None:
        if any("ExecutorFailedError" in (c.expect_errors or ()) for c in run.calls):
            return None  # the failure's time no longer compared with the asking call's start
        return original(run, when)  # type: ignore[no-any-return]
    return _unrequested_failure


def _workers_gone_ignored(original: Any) -> Callable[[RunRecord, str], str | None]:
    def _unrequested_failure(run: RunRecord, when: str) -> str | None:
        return original(dataclasses.replace(run, workers_gone=[]), when)  # type: ignore[no-any-return]
    return _unrequested_failure


def _failed_calls_ignored(original: Any) -> Callable[[RunRecord, str], str | None]:
    def _unrequested_failure(run: RunRecord, when: str) -> str | None:
        calls = [c for c in run.calls if c.error_type != "ExecutorFailedError"]
        return original(dataclasses.replace(run, calls=calls), when)  # type: ignore[no-any-return]
    return _unrequested_failure


# -- planned_faults_fired, damage_has_a_cause -------------------------------------------------

def _may_not_fire_ignored(original: Oracle) -> Oracle:
    def planned_faults_fired(run: RunRecord) -> list[Violation]:
        planned = [{**p, "may_not_fire": False} for p in run.planned]
        return original(dataclasses.replace(run, planned=planned))
    return planned_faults_fired


def _fired_by_kind(original: Oracle) -> Oracle:
    def planned_faults_fired(run: RunRecord) -> list[Violation]:
        fired = {f["kind"] for f in run.faults}
        return [Violation("unfired", f"planned fault {p['index']} ({p['kind']}) never fired")
                for p in run.planned if p["kind"] not in fired and not p.get("may_not_fire")]
    return planned_faults_fired


def _any_fault_a_cause(original: Oracle) -> Oracle:
    def damage_has_a_cause(run: RunRecord) -> list[Violation]:
        return [] if run.faults else original(run)
    return damage_has_a_cause


def _failure_text_unread(original: Oracle) -> Oracle:
    def damage_has_a_cause(run: RunRecord) -> list[Violation]:
        return original(dataclasses.replace(run, failed_before_shutdown=None))
    return damage_has_a_cause


# -- edge_oracles -----------------------------------------------------------------------------

def _future_judged_at_interrupt(original: Oracle) -> Oracle:
    def interrupts_contained(run: RunRecord) -> list[Violation]:
        # a future outstanding at the SIGINT judged as if its caller had been interrupted
        calls = [dataclasses.replace(c, non_block=False) for c in run.calls]
        return original(dataclasses.replace(run, calls=calls))
    return interrupts_contained


def _reaped_needs_no_reaper(original: Oracle) -> Oracle:
    def fork_contained(run: RunRecord) -> list[Violation]:
        reports = [{**r, "exit": "exit status 0"} if r.get("exit") == "reaped elsewhere" else r
                   for r in run.fork_reports]
        return original(dataclasses.replace(run, fork_reports=reports))
    return fork_contained


def _fork_blamed_with_others(original: Oracle) -> Oracle:
    def fork_contained(run: RunRecord) -> list[Violation]:
        out = original(run)
        if any(f["kind"] == "fork_in_driver" for f in run.faults) and run.failed_before_shutdown \
                and not any(v.message.startswith("the parent's executor failed") for v in out):
            out.append(Violation("fork", "the parent's executor failed after a forked child of "
                                         f"the driver: {run.failed_before_shutdown[:300]}"))
        return out  # "alone" dropped: a failure another fault caused is blamed on the fork
    return fork_contained


def _late_callback_unchecked(original: Oracle) -> Oracle:
    def callbacks_on_failure(run: RunRecord) -> list[Violation]:
        return original(dataclasses.replace(run, late_callback_ran=None))
    return callbacks_on_failure


def _order_of_strength(reverse: bool, exit_first: bool) -> Callable[[Any], Any]:
    def make(original: Any) -> Callable[[list[Any]], Outcome | None]:
        def combined_outcome(faults: list[Any]) -> Outcome | None:
            order = list(Outcome)
            found = [outcomes.outcome_for(f) for f in faults]
            if not found:
                return None
            def key(o: Outcome) -> tuple[bool, int]:
                return ((o != Outcome.EXIT_CLEAN) if exit_first else False,
                        -order.index(o) if reverse else order.index(o))
            return min(found, key=key)
        return combined_outcome
    return make


_M, _E, _O = "chaos.oracles", "chaos.edge_oracles", "chaos.outcomes"

PLANTED: list[PlantedJudge] = [
    PlantedJudge("oracles.results.reply_unpickling_undocumented", f"{_M}:DOCUMENTED_ERRORS",
                 "ReplyUnpicklingError left out of the documented errors",
                 lambda errors: errors - {"ReplyUnpicklingError"}),
    PlantedJudge("oracles.results.any_ctrl_c", f"{_M}:results_correct",
                 "a KeyboardInterrupt passes with no interrupt_driver fault fired",
                 _any_ctrl_c_exempt),
    PlantedJudge("oracles.deadline.no_slack", f"{_M}:deadline_bound",
                 "a call's deadline compared with no slack", _no_slack),
    PlantedJudge("oracles.deadline.detect_bound_as_slack", f"{_M}:deadlines_met",
                 "the deadline slack read from detect_s",
                 _bound_read_from("deadline_slack_s", "detect_s")),
    PlantedJudge("oracles.deadline.wait_ignored", f"{_M}:deadline_bound",
                 "a future's deadline counted from its submission even when waited on later",
                 _wait_ignored),
    PlantedJudge("oracles.detection.exit_bound", f"{_M}:failure_detected",
                 "the detection latency compared with exit_s instead of detect_s",
                 _bound_read_from("detect_s", "exit_s")),
    PlantedJudge("oracles.detection.shutdown_slack", f"{_M}:failure_detected",
                 "the detection latency compared with shutdown_slack_s instead of detect_s",
                 _bound_read_from("detect_s", "shutdown_slack_s")),
    PlantedJudge("oracles.detection.from_last_fault", f"{_M}:failure_detected",
                 "latency counted from the last fatal fault, not the first", _from_last_fault),
    PlantedJudge("oracles.detection.latest_signal", f"{_M}:_detection_ns",
                 "detection taken as the latest sign of failure, not the first", _latest_signal),
    PlantedJudge("oracles.detection.signals_before_fault", f"{_M}:_detection_ns",
                 "a callback from before the fault counted as its detection",
                 _signals_before_the_fault),
    PlantedJudge("oracles.detection.unread_any_queue", "chaos.run_record:RunRecord.unread_damage",
                 "damage to a request exempted like an unread reply", _unread_any_queue),
    PlantedJudge("oracles.callback.twice_allowed", f"{_M}:callback_once",
                 "the callback may run twice (n > 2)", _twice_allowed),
    PlantedJudge("oracles.order.ctrl_c_queued", f"{_M}:_NEVER_QUEUED",
                 "a call a Ctrl-C ended is given a place in line",
                 lambda never: tuple(e for e in never if e != "KeyboardInterrupt")),
    PlantedJudge("oracles.order.worker_error_unqueued", f"{_M}:_NEVER_QUEUED",
                 "a call that raised WorkerError is taken for one never queued",
                 lambda never: (*never, "WorkerError")),
    PlantedJudge("oracles.leak.threads_ignored", f"{_M}:nothing_leaked",
                 "a thread left running is not a leak", _threads_ignored),
    PlantedJudge("oracles.shutdown.slack_as_bound", f"{_M}:shutdown_bounded",
                 "shutdown() compared with the shutdown slack, not its bound",
                 _shutdown_slack_as_bound),
    PlantedJudge("oracles.shutdown.at_bound_late", f"{_M}:shutdown_bounded",
                 "shutdown() exactly at its bound called late (>= for >)",
                 _shutdown_at_bound_late),
    PlantedJudge("oracles.outcome.deadline_over_death", f"{_M}:observed_outcome",
                 "a run with a deadline and a death observed as a deadline",
                 _deadline_over_death),
    PlantedJudge("oracles.outcome.callback_no_failure", f"{_M}:observed_outcome",
                 "a failure callback alone not taken as the executor failing",
                 _callback_no_failure),
    PlantedJudge("oracles.outcome.error_recover_needs_a_later_ok", f"{_M}:observed_outcome",
                 "ERROR_RECOVER only when the last call succeeded, a WorkerError alone RECOVER "
                 "(the rule before issue 31: the outcome hung on the error's place in the run)",
                 _error_recover_by_position),
    PlantedJudge("oracles.outcome.fail_call_counted", f"{_M}:_unasked_error",
                 "a fail call's own WorkerError taken for the fault's",
                 lambda original: lambda c: c.outcome == "error"
                 and c.error_type not in (c.expect_errors or ())),
    PlantedJudge("oracles.outcome.declared_counted", f"{_M}:_unasked_error",
                 "an error the call declared taken for the fault's",
                 lambda original: lambda c: c.outcome == "error"
                 and c.error_type != recording.requested_error(c)),
    PlantedJudge("oracles.outcome.deadline_exemption_widened", f"{_M}:_hit_had_deadline",
                 "only a call that failed counts as having had a deadline", _never_had_deadline),
    PlantedJudge("oracles.fault_free.sleep_past_timeout_only", "chaos.recording:requested_error",
                 "a sleep exactly as long as its timeout does not ask to time out (> for >=)",
                 _sleep_past_timeout_only),
    PlantedJudge("oracles.fault_free.queue_full_not_a_timeout",
                 "chaos.recording:timed_out_as_requested",
                 "a QueueFullError at a requested deadline is not a timeout",
                 _queue_full_not_a_timeout),
    PlantedJudge("oracles.fault_free.any_timeout", f"{_M}:_not_as_requested",
                 "every TimeoutError taken as requested", _any_timeout_requested),
    PlantedJudge("oracles.fault_free.asked_at_any_time", f"{_M}:_unrequested_failure",
                 "a failure before the call that asked for it passes", _asked_at_any_time),
    PlantedJudge("oracles.fault_free.workers_gone_ignored", f"{_M}:_unrequested_failure",
                 "workers gone before shutdown() are not a failure", _workers_gone_ignored),
    PlantedJudge("oracles.fault_free.failed_calls_ignored", f"{_M}:_unrequested_failure",
                 "calls that raised ExecutorFailedError are not a sign of failure",
                 _failed_calls_ignored),
    PlantedJudge("oracles.unfired.may_not_fire_ignored", f"{_M}:planned_faults_fired",
                 "a fault declared may_not_fire reported unfired", _may_not_fire_ignored),
    PlantedJudge("oracles.unfired.by_kind", f"{_M}:planned_faults_fired",
                 "planned faults matched to fired ones by kind, not index", _fired_by_kind),
    PlantedJudge("oracles.damage.any_fault", f"{_M}:damage_has_a_cause",
                 "any fault fired taken as the cause of damage", _any_fault_a_cause),
    PlantedJudge("oracles.damage.failure_text_unread", f"{_M}:damage_has_a_cause",
                 "the executor's failure text not searched for damage", _failure_text_unread),
    PlantedJudge("oracles.damage.words_one_short", f"{_M}:DAMAGE_WORDS",
                 "a worker's wording of damage not known",
                 lambda words: tuple(w for w in words if "shared-memory" not in w)),
    PlantedJudge("oracles.declared.star_covers_timeout", f"{_E}:_NOT_ANY",
                 '"*" in expect_errors covers a TimeoutError', lambda s: s - {"TimeoutError"}),
    PlantedJudge("oracles.declared.every_kind_fatal", f"{_E}:_FATAL_KINDS",
                 "every fault kind may fail the executor", lambda s: frozenset(KINDS)),
    PlantedJudge("oracles.interrupt.future_judged", f"{_E}:interrupts_contained",
                 "a future outstanding at a SIGINT must raise KeyboardInterrupt",
                 _future_judged_at_interrupt),
    PlantedJudge("oracles.fork.reaped_needs_no_reaper", f"{_E}:fork_contained",
                 "a forked child 'reaped elsewhere' passes with no outside reaper",
                 _reaped_needs_no_reaper),
    PlantedJudge("oracles.fork.blamed_with_others", f"{_E}:fork_contained",
                 "the parent's failure blamed on a fork although another fault fired",
                 _fork_blamed_with_others),
    PlantedJudge("oracles.backpressure.every_kind_stops_readers", f"{_E}:_STOP_READERS",
                 "every fault kind excuses a QueueFullError", lambda s: frozenset(KINDS)),
    PlantedJudge("oracles.callbacks.late_unchecked", f"{_E}:callbacks_on_failure",
                 "a callback registered on a failed executor need not run at once",
                 _late_callback_unchecked),
    PlantedJudge("oracles.table.after_execute_escapes", f"{_O}:_CAUGHT_PHASES",
                 "an exception after execute taken to escape the serve loop",
                 lambda phases: tuple(p for p in phases if p != "after_execute")),
    PlantedJudge("oracles.table.before_reply_caught", f"{_O}:_CAUGHT_PHASES",
                 "an exception before the reply taken to become an error reply",
                 lambda phases: (*phases, "before_reply")),
    PlantedJudge("oracles.table.all_ff_recovers", f"{_O}:_FATAL_DAMAGE",
                 "every metadata byte set to 0xFF taken for damage a checksum catches",
                 lambda modes: tuple(m for m in modes if m != "all_ff")),
    PlantedJudge("oracles.table.weakest_wins", f"{_O}:combined_outcome",
                 "several faults: the weakest outcome taken, not the strongest",
                 _order_of_strength(reverse=True, exit_first=True)),
    PlantedJudge("oracles.table.driver_death_not_first", f"{_O}:combined_outcome",
                 "the driver's death does not dominate a worker's",
                 _order_of_strength(reverse=False, exit_first=False)),
]
