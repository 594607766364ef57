"""faultlab's own run oracles (chaos.oracles, chaos.edge_oracles, chaos.run_record) and the
expected-outcome table (chaos.outcomes), each proven on hand-made RunRecords (or faults): a
FIRE case and a QUIET twin that differs in one fact, and every planted judge of area
"oracles" caught.

    run(calls, faults, ...) ──one fact changed──► an oracle ──► one assertion on its verdict

Every bound differs from every other on purpose (deadline slack 0.25 s, detection 0.5 s,
shutdown() 1.5 s, shutdown slack 2 s, exit 3 s, workload 7 s), and the cases sit between
them: a judge that compares against the wrong bound gives another verdict.  Fault timelines
hold two fatal faults 0.3 s apart and several detection signals, so "the first" and "the
last" differ.  Call i starts at i s (wall clock T0 + i s) and ends 0.1 s later unless told.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from judge_cases import assert_caught, case_id

from chaos import edge_oracles, oracles, outcomes
from chaos.faults import (
    CorruptQueue,
    HangWorker,
    InterruptDriver,
    KillDriver,
    KillWorker,
    RaiseInWorker,
    SlowWorker,
)
from chaos.outcomes import HIT, Outcome
from chaos.planted_judges import planted_in
from chaos.recording import UNKNOWN, CallRecord
from chaos.run_record import Bounds, RunRecord, Violation

SEC = 1_000_000_000
T0 = 1_000 * SEC  # wall clock (ns) at monotonic 0.0
BOUNDS = Bounds(deadline_slack_s=0.25, detect_s=0.5, shutdown_slack_s=2.0, exit_s=3.0,
                workload_s=7.0)
SHUTDOWN_BOUND_S = 1.5
ECHOED = ["x", "x"]  # echo("x") on two ranks
# Written out, not read from chaos.oracles: a plant that changes the constant must show.
DOCUMENTED = ("ExecutorFailedError", "WorkerError", "CorruptMessageError", "TimeoutError",
              "QueueFullError", "ReplyUnpicklingError", "RequestPicklingError")
NEVER_QUEUED = ("QueueFullError", "RequestPicklingError", "KeyboardInterrupt")
DAMAGED_RING = "the rpc queue cannot be trusted: chunk 3's seq went backwards"
DAMAGED_WORKER = "worker rank 1 (pid 4242) found its shared-memory queue damaged"


def ns(t: float) -> int:
    return T0 + round(t * SEC)


def call(index: int, method: str = "echo", args: tuple[Any, ...] = ("x",), *,
         start: float | None = None, end: float | None = None, timeout: float | None = None,
         outcome: str = "ok", value: Any = None, expected: Any = None, error_type: str = "",
         non_block: bool = False, waited_at: float | None = None, seq: int | None = -1,
         expect_errors: frozenset[str] | None = None, check: str = "",
         error: str = "") -> CallRecord:
    """Call ``index``: an ok echo("x") from ``index`` s to 0.1 s later, resolved ``index``th."""
    start = float(index) if start is None else start
    if end is None and outcome != "pending":
        end = start + 0.1
    if expected is None:
        expected = ECHOED if method == "echo" else UNKNOWN
    if value is None and outcome == "ok":
        value = expected
    return CallRecord(
        index, method, args, timeout, non_block, None, expected, ns(start), start, end=end,
        end_ns=None if end is None else ns(end), outcome=outcome, value=value,
        error_type=error_type, error=error or (f"{error_type}: boom" if error_type else ""),
        resolved_seq=(index if seq == -1 else seq) if outcome != "pending" else None,
        waited_at=waited_at, expect_errors=expect_errors, check=check)


def err(index: int, error_type: str, method: str = "echo", **kw: Any) -> CallRecord:
    return call(index, method, outcome="error", error_type=error_type, **kw)


FATAL = {"kill_worker", "term_worker", "exit_worker", "corrupt_queue", "kill_node"}


def fault(index: int, kind: str, t: float, **extra: Any) -> dict[str, Any]:
    return {"index": index, "kind": kind, "time_ns": ns(t), "fatal": kind in FATAL,
            "rank": 1, "pid": 4242, **extra}


def run(*calls: CallRecord, faults: tuple[dict[str, Any], ...] = (), **changes: Any) -> RunRecord:
    return RunRecord(calls=list(calls), faults=list(faults), bounds=BOUNDS,
                     shutdown_bound_s=SHUTDOWN_BOUND_S, **changes)


def seen(violations: list[Violation]) -> list[str]:
    return [v.invariant for v in violations]


# -- results_correct --------------------------------------------------------------------------

def quiet_results_right_value() -> None:
    assert oracles.results_correct(run(call(0), call(1))) == []


def fire_results_wrong_value() -> None:
    assert seen(oracles.results_correct(run(call(0), call(1, value=["x", "y"])))) == ["results"]


def quiet_results_each_documented_error() -> None:
    for name in DOCUMENTED:
        assert oracles.results_correct(run(err(0, name))) == [], name


def fire_results_undocumented_error() -> None:
    assert seen(oracles.results_correct(run(err(0, "RuntimeError")))) == ["results"]


def fire_results_ctrl_c_with_no_interrupt_fault() -> None:
    r = run(err(0, "KeyboardInterrupt"), faults=(fault(0, "slow_worker", 0.05),))
    assert seen(oracles.results_correct(r)) == ["results"]


def quiet_results_ctrl_c_of_an_interrupt_fault() -> None:
    r = run(err(0, "KeyboardInterrupt"), faults=(fault(0, "interrupt_driver", 0.05),))
    assert oracles.results_correct(r) == []


def fire_results_future_never_resolved() -> None:
    r = run(call(0, outcome="pending", non_block=True))
    assert seen(oracles.results_correct(r)) == ["results"]


def quiet_results_blocking_call_unfinished() -> None:  # never_hung's, not a future's
    assert oracles.results_correct(run(call(0, outcome="pending"))) == []


def fire_results_fail_returned() -> None:
    assert seen(oracles.results_correct(run(call(0, "fail", (), value=None)))) == ["results"]


def quiet_results_fail_raised() -> None:
    assert oracles.results_correct(run(err(0, "WorkerError", "fail", args=()))) == []


def quiet_results_declared_call_judged_elsewhere() -> None:
    r = run(err(0, "RuntimeError", expect_errors=frozenset({"RuntimeError"})))
    assert oracles.results_correct(r) == []


# -- deadlines_met (timeout 1 s from 0: deadline 1.0, slack 0.25, detect_s 0.5) ---------------

def timed(end: float, **kw: Any) -> RunRecord:
    return run(err(0, "TimeoutError", start=0.0, end=end, timeout=1.0, **kw))


def quiet_deadline_within_slack() -> None:
    assert oracles.deadlines_met(timed(1.2)) == []


def fire_deadline_beyond_slack() -> None:  # 1.3 s: past 1.25, short of 1.5 (detect_s)
    [v] = oracles.deadlines_met(timed(1.3))
    assert v.invariant == "deadline" and "plus 0.25 s" in v.message


def quiet_deadline_from_a_late_wait() -> None:  # asked at 2.0: bound 2.25
    assert oracles.deadlines_met(timed(2.2, non_block=True, waited_at=2.0)) == []


def fire_deadline_from_an_early_wait() -> None:  # asked at 0.5: bound 1.25
    assert seen(oracles.deadlines_met(timed(2.2, non_block=True, waited_at=0.5))) == ["deadline"]


def quiet_deadline_future_never_waited_on() -> None:
    assert oracles.deadlines_met(timed(5.0, non_block=True)) == []


def fire_deadline_future_waited_on() -> None:
    assert seen(oracles.deadlines_met(timed(5.0, non_block=True, waited_at=0.1))) == ["deadline"]


def quiet_deadline_none() -> None:
    assert oracles.deadlines_met(run(call(0, start=0.0, end=5.0))) == []


# -- failure_detected (fatal faults at 1.0 and 1.3 s; detect_s 0.5) ---------------------------

TWO_DEATHS = (fault(0, "kill_worker", 1.0), fault(1, "kill_worker", 1.3, rank=0, pid=4241))


def quiet_detected_within_bound() -> None:
    r = run(call(0), faults=TWO_DEATHS, callback_times_ns=[ns(1.4)])
    assert oracles.failure_detected(r) == []
    assert oracles.detection_latency_s(r) == pytest.approx(0.4)


def fire_detected_late() -> None:  # 0.6 s after the first death, 0.3 s after the second
    r = run(call(0), faults=TWO_DEATHS, callback_times_ns=[ns(1.6)])
    [v] = oracles.failure_detected(r)
    assert v.invariant == "detection" and "0.600 s" in v.message and "rank 1" in v.message
    assert oracles.detection_latency_s(r) == pytest.approx(0.6)


def quiet_detected_by_the_first_signal() -> None:  # later signals do not count against it
    r = run(err(2, "ExecutorFailedError", start=1.2, end=2.5), faults=TWO_DEATHS,
            callback_times_ns=[ns(2.7), ns(1.4)], failed_at_ns=ns(2.6))
    assert oracles.failure_detected(r) == []
    assert oracles.detection_latency_s(r) == pytest.approx(0.4)


def quiet_detected_by_failed_at() -> None:
    assert oracles.failure_detected(run(faults=TWO_DEATHS, failed_at_ns=ns(1.4))) == []


def quiet_detected_by_a_failed_call() -> None:
    r = run(err(0, "ExecutorFailedError", start=0.9, end=1.4), faults=TWO_DEATHS)
    assert oracles.failure_detected(r) == []


def fire_never_detected() -> None:
    [v] = oracles.failure_detected(run(call(0), faults=TWO_DEATHS))
    assert v.invariant == "detection" and "never detected" in v.message


def fire_detected_only_before_the_fault() -> None:  # a callback at 0.5 s is not this death's
    [v] = oracles.failure_detected(run(faults=TWO_DEATHS, callback_times_ns=[ns(0.5)]))
    assert "never detected" in v.message
    assert oracles.detection_latency_s(run(faults=TWO_DEATHS, callback_times_ns=[ns(0.5)])) is None


def quiet_a_non_fatal_fault_needs_no_detection() -> None:
    assert oracles.failure_detected(run(call(0), faults=(fault(0, "hang_worker", 1.0),))) == []


def damage(t: float, queue: str) -> dict[str, Any]:
    return fault(0, "corrupt_queue", t, queue=queue)


def quiet_unread_damage_needs_no_detection() -> None:  # a reply damaged after every call ended
    assert oracles.failure_detected(run(call(0), faults=(damage(1.0, "reply"),))) == []


def fire_damaged_request_must_be_detected() -> None:  # the workers read requests unasked
    assert seen(oracles.failure_detected(run(call(0), faults=(damage(1.0, "rpc"),)))) == ["detection"]


def fire_damage_while_a_call_waits_must_be_detected() -> None:
    r = run(call(0, start=0.0, end=1.5), faults=(damage(1.0, "reply"),))
    assert seen(oracles.failure_detected(r)) == ["detection"]


def quiet_damage_while_a_ctrl_c_gave_the_call_up() -> None:
    r = run(err(0, "KeyboardInterrupt", start=0.0, end=1.5), faults=(damage(1.0, "reply"),))
    assert oracles.failure_detected(r) == []


# -- callback_once ----------------------------------------------------------------------------

def quiet_callback_once() -> None:
    assert oracles.callback_once(run(callback_times_ns=[ns(1.0)])) == []
    assert oracles.callback_once(run()) == []


def fire_callback_twice() -> None:
    [v] = oracles.callback_once(run(callback_times_ns=[ns(1.0), ns(1.1)]))
    assert v.invariant == "callback" and "2 times" in v.message


# -- futures_in_order -------------------------------------------------------------------------

def swapped(first: CallRecord) -> RunRecord:
    """``first`` (call 0) resolved after call 1."""
    first.resolved_seq = 1
    return run(first, call(1, seq=0), call(2))


def quiet_futures_in_order() -> None:
    assert oracles.futures_in_order(run(call(0), call(1), call(2))) == []


def fire_futures_out_of_order() -> None:
    [v] = oracles.futures_in_order(swapped(call(0)))
    assert v.invariant == "order" and v.message.startswith("call 1 echo resolved before call 0")


def fire_futures_out_of_order_after_a_worker_error() -> None:
    assert seen(oracles.futures_in_order(swapped(err(0, "WorkerError")))) == ["order"]


def fire_futures_out_of_order_after_a_failure() -> None:
    assert seen(oracles.futures_in_order(swapped(err(0, "ExecutorFailedError")))) == ["order"]


def quiet_futures_a_timed_out_call_is_left_behind() -> None:
    assert oracles.futures_in_order(swapped(err(0, "TimeoutError"))) == []


def quiet_futures_never_queued_have_no_place() -> None:
    for name in NEVER_QUEUED:
        assert oracles.futures_in_order(swapped(err(0, name))) == [], name


def quiet_futures_a_call_in_a_callback_nests() -> None:
    assert oracles.futures_in_order(swapped(call(0, check="callbacks"))) == []


def quiet_futures_a_pending_call_between() -> None:
    assert oracles.futures_in_order(run(call(0), call(1, outcome="pending"), call(2))) == []


# -- nothing_leaked ---------------------------------------------------------------------------

LEAKS = ("worker pid 4242 is still alive after shutdown",
         "thread 'faultlab-monitor' is still running after shutdown",
         "/dev/shm/faultlab_1_rpc was not unlinked",
         "file descriptor 9 (pipe:[1]) was left open",
         "child process 4243 (zombie) was left behind")


def fire_each_leak() -> None:
    for leak in LEAKS:
        assert oracles.nothing_leaked(run(leaks=[leak])) == [Violation("leak", leak)], leak


def quiet_nothing_leaked() -> None:
    assert oracles.nothing_leaked(run()) == []


# -- shutdown_bounded (bound 1.5 s; the shutdown slack 2 s is not the bound) -------------------

def quiet_shutdown_within_bound() -> None:
    assert oracles.shutdown_bounded(run(shutdown_s=1.4)) == []
    assert oracles.shutdown_bounded(run(shutdown_s=None)) == []


def quiet_shutdown_at_its_bound() -> None:
    assert oracles.shutdown_bounded(run(shutdown_s=1.5)) == []


def fire_shutdown_beyond_bound() -> None:
    [v] = oracles.shutdown_bounded(run(shutdown_s=1.6))
    assert v.invariant == "shutdown" and "1.5 s bound" in v.message


# -- never_hung -------------------------------------------------------------------------------

def fire_hung() -> None:
    [v] = oracles.never_hung(run(hung=True))
    assert v.invariant == "hang" and "within 7 s" in v.message


def quiet_not_hung() -> None:
    assert oracles.never_hung(run(hung=False)) == []


# -- observed_outcome, outcome_matches --------------------------------------------------------

def observed(*calls: CallRecord, **changes: Any) -> Outcome:
    return oracles.observed_outcome(run(*calls, **changes))


def fire_outcome_fail_fast_by_each_sign() -> None:
    assert observed(call(0), failed_at_ns=ns(0.5)) == Outcome.FAIL_FAST
    assert observed(call(0), callback_times_ns=[ns(0.5)]) == Outcome.FAIL_FAST
    assert observed(err(0, "ExecutorFailedError")) == Outcome.FAIL_FAST


def fire_outcome_death_and_deadline_is_fail_fast() -> None:
    assert observed(err(0, "TimeoutError"), err(1, "ExecutorFailedError")) == Outcome.FAIL_FAST


def quiet_outcome_deadline_alone() -> None:
    assert observed(err(0, "TimeoutError"), call(1)) == Outcome.DEADLINE


def fire_outcome_interrupt_over_deadline() -> None:
    assert observed(err(0, "TimeoutError"), err(1, "KeyboardInterrupt")) == Outcome.INTERRUPT


def fire_outcome_error_then_recover() -> None:
    assert observed(err(0, "WorkerError"), call(1)) == Outcome.ERROR_RECOVER
    assert observed(err(0, "CorruptMessageError"), call(1)) == Outcome.ERROR_RECOVER
    assert observed(err(0, "ReplyUnpicklingError"), call(1)) == Outcome.ERROR_RECOVER


def fire_outcome_error_on_the_last_call() -> None:  # no later call to succeed: still an error
    assert observed(call(0), err(1, "WorkerError")) == Outcome.ERROR_RECOVER
    assert observed(call(0), err(1, "CorruptMessageError")) == Outcome.ERROR_RECOVER


def quiet_outcome_recover() -> None:
    assert observed(call(0), call(1)) == Outcome.RECOVER


def quiet_outcome_a_fail_call_raised_as_asked() -> None:  # wherever it stands
    assert observed(call(0), err(1, "WorkerError", "fail", args=())) == Outcome.RECOVER
    assert observed(err(0, "WorkerError", "fail", args=()), call(1)) == Outcome.RECOVER


def quiet_outcome_a_declared_error() -> None:
    c = err(0, "WorkerError", expect_errors=frozenset({"ok", "WorkerError"}))
    assert observed(c, call(1)) == Outcome.RECOVER


def fire_outcome_an_error_other_than_declared() -> None:
    c = err(0, "CorruptMessageError", expect_errors=frozenset({"ok", "WorkerError"}))
    assert observed(c, call(1)) == Outcome.ERROR_RECOVER


def quiet_outcome_as_expected() -> None:
    r = run(err(0, "TimeoutError", timeout=1.0), call(1), expected=Outcome.DEADLINE)
    assert oracles.outcome_matches(r) == []


def fire_outcome_other_than_expected() -> None:
    r = run(err(0, "TimeoutError", timeout=1.0), call(1), expected=Outcome.FAIL_FAST)
    [v] = oracles.outcome_matches(r)
    assert v.invariant == "outcome" and "expected fail_fast, observed deadline" in v.message


def quiet_outcome_deadline_that_hit_no_timed_call() -> None:
    assert oracles.outcome_matches(run(call(0), call(1), expected=Outcome.DEADLINE)) == []


def fire_outcome_deadline_that_hit_a_timed_call() -> None:
    r = run(call(0, timeout=1.0), call(1), expected=Outcome.DEADLINE)
    assert seen(oracles.outcome_matches(r)) == ["outcome"]


def quiet_outcome_interrupt_between_calls() -> None:
    assert oracles.outcome_matches(run(call(0), expected=Outcome.INTERRUPT)) == []


def quiet_outcome_not_judged() -> None:
    assert oracles.outcome_matches(run(err(0, "ExecutorFailedError"), expected=None)) == []
    r = run(err(0, "ExecutorFailedError"), expected=Outcome.FAULT_FREE)
    assert oracles.outcome_matches(r) == []


# -- outcomes.outcome_for, combined_outcome: the expected-outcome table ------------------------

CAUGHT = ("before_unpickle", "before_execute", "after_execute", "before_pickle_reply")
UNCAUGHT = ("after_dequeue", "before_reply", "after_reply")


def quiet_table_raise_where_the_worker_catches_it() -> None:
    for phase in CAUGHT:
        fault = RaiseInWorker(rank=1, on_call=HIT, phase=phase)
        assert outcomes.outcome_for(fault) == Outcome.ERROR_RECOVER, phase


def fire_table_raise_where_it_escapes_the_serve_loop() -> None:
    for phase in UNCAUGHT:
        fault = RaiseInWorker(rank=1, on_call=HIT, phase=phase)
        assert outcomes.outcome_for(fault) == Outcome.FAIL_FAST, phase


def fire_table_damage_that_is_fatal() -> None:
    for mode in ("clobber_seq", "clobber_flags", "overwrite_unread", "clear_written", "all_ff"):
        assert outcomes.outcome_for(CorruptQueue(on_call=HIT, mode=mode)) == Outcome.FAIL_FAST, mode


def quiet_table_damage_a_checksum_catches() -> None:
    for mode in ("flip_payload", "truncate"):
        fault = CorruptQueue(on_call=HIT, mode=mode)
        assert outcomes.outcome_for(fault) == Outcome.ERROR_RECOVER, mode
    assert outcomes.outcome_for(CorruptQueue(on_call=HIT, mode="drop")) == Outcome.DEADLINE


def fire_table_each_kind_its_own_word() -> None:
    assert outcomes.outcome_for(KillWorker(rank=1, on_call=HIT)) == Outcome.FAIL_FAST
    assert outcomes.outcome_for(HangWorker(rank=1, on_call=HIT)) == Outcome.DEADLINE
    assert outcomes.outcome_for(InterruptDriver(on_call=HIT)) == Outcome.INTERRUPT
    assert outcomes.outcome_for(KillDriver(on_call=HIT)) == Outcome.EXIT_CLEAN
    assert outcomes.outcome_for(SlowWorker(rank=1, probability=1.0, delay=0.02)) == Outcome.RECOVER


def fire_table_a_death_and_a_deadline_fail_fast() -> None:
    both = [HangWorker(rank=1, on_call=HIT), KillWorker(rank=0, on_call=HIT)]
    assert outcomes.combined_outcome(both) == Outcome.FAIL_FAST
    assert outcomes.combined_outcome(both[::-1]) == Outcome.FAIL_FAST


def quiet_table_a_deadline_alone() -> None:
    hang = HangWorker(rank=1, on_call=HIT)
    assert outcomes.combined_outcome([hang, SlowWorker(rank=1, probability=1.0, delay=0.02)]) \
        == Outcome.DEADLINE
    assert outcomes.combined_outcome([]) is None


def fire_table_the_driver_dying_dominates() -> None:
    faults = [KillWorker(rank=1, on_call=HIT), KillDriver(on_call=HIT)]
    assert outcomes.combined_outcome(faults) == Outcome.EXIT_CLEAN


def quiet_table_an_error_and_a_recovery() -> None:
    faults = [SlowWorker(rank=1, probability=1.0, delay=0.02), RaiseInWorker(rank=1, on_call=HIT)]
    assert outcomes.combined_outcome(faults) == Outcome.ERROR_RECOVER


# -- fault_free_stays_fault_free --------------------------------------------------------------

def free(*calls: CallRecord, **changes: Any) -> list[Violation]:
    return oracles.fault_free_stays_fault_free(run(*calls, expected=Outcome.FAULT_FREE, **changes))


def quiet_ff_all_ok() -> None:
    assert free(call(0), call(1)) == []


def fire_ff_unrequested_error() -> None:
    [v] = free(call(0), err(1, "WorkerError"))
    assert v.invariant == "fault_free" and v.message.startswith("call 1 echo('x') raised")


def quiet_ff_fail_raises_as_asked() -> None:
    assert free(call(0), err(1, "WorkerError", "fail", args=())) == []


def fire_ff_fail_raises_something_else() -> None:
    assert seen(free(err(0, "TimeoutError", "fail", args=(), timeout=1.0))) == ["fault_free"]


def quiet_ff_sleep_times_out_as_asked() -> None:  # sleep(1.0) with timeout 1.0: asks for it
    assert free(err(0, "TimeoutError", "sleep", args=(1.0,), timeout=1.0)) == []


def fire_ff_short_sleep_times_out() -> None:
    assert seen(free(err(0, "TimeoutError", "sleep", args=(0.5,), timeout=1.0))) == ["fault_free"]


def quiet_ff_sleep_queue_full_as_asked() -> None:
    assert free(err(0, "QueueFullError", "sleep", args=(2.0,), timeout=1.0)) == []


def fire_ff_echo_queue_full() -> None:
    assert seen(free(err(0, "QueueFullError", timeout=1.0))) == ["fault_free"]


def quiet_ff_declared_error() -> None:
    assert free(err(0, "RuntimeError", expect_errors=frozenset({"RuntimeError"}))) == []


def fire_ff_executor_failed() -> None:
    [v] = free(call(0), failed_at_ns=ns(0.5))
    assert v.invariant == "fault_free" and "the executor failed" in v.message


def fire_ff_a_call_saw_the_failure() -> None:  # one finding for the failure, not per call
    [v] = free(call(0), err(1, "ExecutorFailedError"))
    assert "the executor failed" in v.message and "1 call(s)" in v.message


def fire_ff_callback_ran() -> None:
    assert seen(free(call(0), callback_times_ns=[ns(0.5)])) == ["fault_free"]


def fire_ff_workers_gone() -> None:
    assert seen(free(call(0), workers_gone=["worker rank 1 (pid 4242) exited"])) == ["fault_free"]


def fire_ff_failed_before_shutdown() -> None:
    assert seen(free(call(0), failed_before_shutdown="worker rank 1 died")) == ["fault_free"]


def ended_on_purpose(failed_at: float) -> list[Violation]:
    """Call 1 (from 1.0 s) declares ExecutorFailedError: it ends the workers."""
    return free(call(0), err(1, "ExecutorFailedError", "exit", args=(),
                              expect_errors=frozenset({"ExecutorFailedError"})),
                failed_at_ns=ns(failed_at))


def quiet_ff_failure_asked_for() -> None:
    assert ended_on_purpose(1.05) == []


def fire_ff_failure_before_it_was_asked_for() -> None:
    assert seen(ended_on_purpose(0.5)) == ["fault_free"]


def quiet_ff_a_hang_is_never_hungs() -> None:
    assert free(err(0, "ExecutorFailedError"), failed_at_ns=ns(0.5), hung=True) == []


def quiet_ff_other_expectation() -> None:
    r = run(err(0, "WorkerError"), failed_at_ns=ns(0.5), expected=Outcome.ERROR_RECOVER)
    assert oracles.fault_free_stays_fault_free(r) == []


# -- planned_faults_fired ---------------------------------------------------------------------

def planned(index: int, kind: str, may_not_fire: bool = False) -> dict[str, Any]:
    return {"index": index, "kind": kind, "target": "rank 1", "trigger": "on call 1 of echo",
            "may_not_fire": may_not_fire}


def quiet_planned_all_fired() -> None:
    r = run(faults=(fault(0, "kill_worker", 1.0), fault(1, "slow_worker", 1.1)),
            planned=[planned(0, "kill_worker"), planned(1, "slow_worker")])
    assert oracles.planned_faults_fired(r) == []


def quiet_planned_may_not_fire() -> None:
    r = run(faults=(fault(0, "kill_worker", 1.0),),
            planned=[planned(0, "kill_worker"), planned(1, "slow_worker", may_not_fire=True)])
    assert oracles.planned_faults_fired(r) == []


def fire_planned_unfired() -> None:
    r = run(faults=(fault(0, "kill_worker", 1.0),),
            planned=[planned(0, "kill_worker"), planned(1, "slow_worker")])
    [v] = oracles.planned_faults_fired(r)
    assert v.invariant == "unfired" and v.message.startswith("planned fault 1 (slow_worker")


def fire_planned_same_kind_other_index() -> None:  # fault 0 fired, its twin 1 did not
    r = run(faults=(fault(0, "kill_worker", 1.0),),
            planned=[planned(0, "kill_worker"), planned(1, "kill_worker")])
    [v] = oracles.planned_faults_fired(r)
    assert v.message.startswith("planned fault 1 ")


# -- damage_has_a_cause -----------------------------------------------------------------------

def fire_damage_with_no_fault() -> None:
    [v] = oracles.damage_has_a_cause(run(err(0, "ExecutorFailedError", error=DAMAGED_RING)))
    assert v.invariant == "damage" and DAMAGED_RING in v.message


def quiet_damage_of_a_corrupt_queue() -> None:
    r = run(err(0, "ExecutorFailedError", error=DAMAGED_RING), faults=(damage(0.05, "rpc"),))
    assert oracles.damage_has_a_cause(r) == []


def fire_damage_with_another_fault() -> None:
    r = run(err(0, "ExecutorFailedError", error=DAMAGED_RING),
            faults=(fault(0, "kill_worker", 0.05),))
    assert seen(oracles.damage_has_a_cause(r)) == ["damage"]


def fire_damage_in_the_failure() -> None:
    r = run(call(0), failed_before_shutdown=DAMAGED_WORKER, faults=(fault(0, "hang_worker", 0.05),))
    assert seen(oracles.damage_has_a_cause(r)) == ["damage"]


def quiet_no_damage_said() -> None:
    r = run(err(0, "ExecutorFailedError", error="worker rank 1 (pid 4242) died"),
            failed_before_shutdown="worker rank 1 (pid 4242) died")
    assert oracles.damage_has_a_cause(r) == []


# -- edge_oracles.declared_outcomes -----------------------------------------------------------

def declared(c: CallRecord, *faults: dict[str, Any]) -> list[Violation]:
    return edge_oracles.declared_outcomes(run(c, faults=faults))


def quiet_declared_as_declared() -> None:
    assert declared(err(0, "WorkerError", expect_errors=frozenset({"WorkerError"}))) == []


def fire_declared_another_error() -> None:
    [v] = declared(err(0, "RuntimeError", expect_errors=frozenset({"WorkerError"}), check="hostile"))
    assert v.invariant == "hostile" and "raised RuntimeError" in v.message


def quiet_declared_any_error() -> None:
    assert declared(err(0, "RuntimeError", expect_errors=frozenset({"*"}))) == []


def fire_declared_any_error_is_not_these() -> None:
    for name in ("ExecutorFailedError", "TimeoutError", "KeyboardInterrupt", "SystemExit",
                 "QueueFullError"):
        assert seen(declared(err(0, name, expect_errors=frozenset({"*"})))) == ["declared"], name


def quiet_declared_failure_under_a_fatal_fault() -> None:
    c = err(0, "ExecutorFailedError", expect_errors=frozenset({"ok"}))
    assert declared(c, fault(0, "kill_worker", 0.05)) == []


def fire_declared_failure_under_a_harmless_fault() -> None:
    c = err(0, "ExecutorFailedError", expect_errors=frozenset({"ok"}))
    [v] = declared(c, fault(0, "slow_worker", 0.05))
    assert "expected its own result" in v.message


def fire_declared_ok_not_allowed() -> None:
    assert seen(declared(call(0, expect_errors=frozenset({"WorkerError"})))) == ["declared"]


def quiet_declared_ok_right_value() -> None:
    assert declared(call(0, expect_errors=frozenset({"ok"}))) == []


def fire_declared_ok_wrong_value() -> None:
    assert seen(declared(call(0, value=["y"], expect_errors=frozenset({"ok"})))) == ["declared"]


def fire_declared_never_resolved() -> None:
    c = call(0, outcome="pending", expect_errors=frozenset({"ok"}))
    assert [v.message for v in declared(c)] == ["call 0 echo: did not finish"]


# -- edge_oracles.interrupts_contained (a SIGINT at 1.0 s) ------------------------------------

SIGINT = fault(0, "interrupt_driver", 1.0)


def interrupted(*calls: CallRecord, faults: tuple[dict[str, Any], ...] = (SIGINT,),
                **changes: Any) -> list[Violation]:
    return edge_oracles.interrupts_contained(run(*calls, faults=faults, **changes))


def quiet_interrupt_reached_the_caller() -> None:
    assert interrupted(err(0, "KeyboardInterrupt", start=0.5, end=1.2)) == []


def fire_interrupt_raised_something_else() -> None:
    [v] = interrupted(err(0, "WorkerError", start=0.5, end=1.2))
    assert v.invariant == "interrupt" and "interrupted by SIGINT" in v.message


def quiet_interrupt_a_future_keeps_its_own_outcome() -> None:
    assert interrupted(err(0, "WorkerError", start=0.5, end=1.2, non_block=True)) == []


def quiet_interrupt_with_another_fault() -> None:
    faults = (SIGINT, fault(1, "kill_worker", 1.1))
    assert interrupted(err(0, "WorkerError", start=0.5, end=1.2), faults=faults) == []


def fire_interrupt_failed_the_executor() -> None:
    r = interrupted(err(0, "KeyboardInterrupt", start=0.5, end=1.2),
                    failed_before_shutdown="the driver lost step with its workers")
    assert seen(r) == ["interrupt"]


def fire_interrupt_broke_a_later_call() -> None:
    [v] = interrupted(err(0, "KeyboardInterrupt", start=0.5, end=1.2), err(2, "WorkerError"))
    assert "made after the interrupt" in v.message


def quiet_interrupt_a_later_call_fine() -> None:
    assert interrupted(err(0, "KeyboardInterrupt", start=0.5, end=1.2), call(2)) == []


# -- edge_oracles.fork_contained (fault 3 forks the driver) -----------------------------------

FORK = fault(3, "fork_in_driver", 1.0)


def forked(report: dict[str, Any] | None, *more: dict[str, Any], **changes: Any) -> list[Violation]:
    reports = [] if report is None else [{"index": 3, **report}]
    return edge_oracles.fork_contained(run(call(0), faults=(FORK, *more), fork_reports=reports,
                                           **changes))


CLEAN = {"mode": "exit", "outcome": "ok", "exit": "exit status 0"}


def quiet_fork_clean() -> None:
    assert forked(CLEAN) == []


def fire_fork_never_reported() -> None:
    assert seen(forked(None)) == ["fork"]


def fire_fork_child_hung() -> None:
    assert seen(forked({**CLEAN, "outcome": "hung"})) == ["fork"]


def fire_fork_child_exit_unclean() -> None:
    assert seen(forked({**CLEAN, "exit": "exit status 3"})) == ["fork"]


def fire_fork_child_call_answered() -> None:
    assert seen(forked({**CLEAN, "mode": "call", "value": 1})) == ["fork"]


def fire_fork_child_call_timed_out() -> None:
    report = {**CLEAN, "mode": "call", "outcome": "error", "error_type": "TimeoutError"}
    assert seen(forked(report)) == ["fork"]


def quiet_fork_child_call_clear_error() -> None:
    report = {**CLEAN, "mode": "call", "outcome": "error", "error_type": "RuntimeError"}
    assert forked(report) == []


def quiet_fork_reaped_by_an_outside_reaper() -> None:
    assert forked({**CLEAN, "exit": "reaped elsewhere"}, fault(4, "outside_reaper", 0.5)) == []


def fire_fork_reaped_elsewhere_with_no_reaper() -> None:
    assert seen(forked({**CLEAN, "exit": "reaped elsewhere"})) == ["fork"]


def fire_fork_parent_failed() -> None:
    assert seen(forked(CLEAN, failed_before_shutdown="worker rank 1 died")) == ["fork"]


def quiet_fork_parent_failed_by_another_fault() -> None:
    r = forked(CLEAN, fault(4, "kill_worker", 1.5), failed_before_shutdown="worker rank 1 died")
    assert r == []


def fire_fork_workers_gone() -> None:
    assert seen(forked(CLEAN, workers_gone=["worker rank 1 (pid 4242) exited"])) == ["fork"]


# -- edge_oracles.backpressure_honest ---------------------------------------------------------

def full(c: CallRecord, *faults: dict[str, Any]) -> list[Violation]:
    return edge_oracles.backpressure_honest(run(c, faults=faults))


def fire_queue_full_while_every_reader_reads() -> None:
    assert seen(full(err(0, "QueueFullError", timeout=1.0))) == ["backpressure"]


def quiet_queue_full_with_a_reader_stopped() -> None:
    assert full(err(0, "QueueFullError", timeout=1.0), fault(0, "hang_worker", 0.5)) == []


def fire_queue_full_under_a_fault_that_stops_no_reader() -> None:
    c = err(0, "QueueFullError", timeout=1.0)
    assert seen(full(c, fault(0, "interrupt_driver", 0.5))) == ["backpressure"]


def quiet_queue_full_as_requested() -> None:  # sleep(1.0) with timeout 1.0 asks to time out
    assert full(err(0, "QueueFullError", "sleep", args=(1.0,), timeout=1.0)) == []


# -- edge_oracles.callbacks_on_failure --------------------------------------------------------

def on_failure(**changes: Any) -> list[Violation]:
    return edge_oracles.callbacks_on_failure(run(call(0), **changes))


DIED = "worker rank 1 (pid 4242) died"


def quiet_callback_on_failure() -> None:
    assert on_failure(failed_before_shutdown=DIED, callback_times_ns=[ns(0.5)]) == []
    assert on_failure(failed_before_shutdown=DIED, callback_times_ns=[ns(0.5)],
                      late_callback_ran=True) == []


def fire_no_callback_on_failure() -> None:
    assert seen(on_failure(failed_before_shutdown=DIED)) == ["callback"]


def fire_late_callback_not_run() -> None:
    r = on_failure(failed_before_shutdown=DIED, callback_times_ns=[ns(0.5)], late_callback_ran=False)
    assert seen(r) == ["callback"]


def quiet_no_failure_no_callback() -> None:
    assert on_failure(late_callback_ran=False) == []


# -- the cases, and the plants they catch ------------------------------------------------------

CASES = [value for name, value in sorted(globals().items())
         if name.startswith(("fire_", "quiet_")) and callable(value)]


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_case(case: Any) -> None:
    case()


@pytest.mark.parametrize("judge", planted_in("oracles"), ids=lambda j: j.name)
def test_planted_judge_is_caught(judge: Any) -> None:
    assert_caught(judge, CASES)


def test_records_are_what_they_say() -> None:
    """The frame itself: bounds all differ, so a swapped bound shows."""
    values = [getattr(BOUNDS, f.name) for f in dataclasses.fields(BOUNDS)] + [SHUTDOWN_BOUND_S]
    assert len(set(values)) == len(values)
