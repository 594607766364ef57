"""The history checker's judges, proven: every violation class and every exemption of
chaos.history_check, the info / fail contract chaos.history records, and what
chaos.targets.history gives the checker, each as a FIRE case and a QUIET twin that differs
in one fact; every plant of ``chaos/planted_judges/history.py`` must make a case fail.

    judge                               fire                          quiet twin
    never_completed                     no completion                 an info completion
    wrong_value / reply_to_other        garbage / a later's, an       the model's value; a model
                                        earlier's value               that does not know
    out_of_order                        overtaken, then an ordinary   ... then a Ctrl-C, a deadline,
                                        failure; a failed executor    a refusal; seq in order
                                        (info, not exempt)            though end times are not
    executed_twice                      twice in one incarnation      a new incarnation; another
                                                                      rank; marked replay
    executed_after_fail                 QueueFullError, Pickling      WorkerError (a slower rank,
                                        then a worker ran it          a broadcast's first error),
                                                                      an info refusal
    info / fail (chaos.history)         each fail error is "fail"     each info error is "info"
    RPC span -> call (chaos.history)    a full queue's own rpc ran    a call refused before an
                                                                      rpc id takes no later rpc
    target histories                    ordered target overtaken,     processpool; DriverEnded;
                                        driver exited by itself,      dict keys in another order;
                                        wrong value                   failures are info

Every violation's ops are asserted whole: the smallest set of events that shows it.  Times
(``t``) are distinct from completion order (``seq``) where that matters.

Two cases are regressions of real bugs (both fail on 710cc2a): the order check stopped at the
first overtaken pair (``fire_each_overtaken_call_once_naming_its_first_overtaker``), and a
call refused before an rpc id was drawn took the next call's RPC span and executions
(``quiet_a_refused_call_takes_no_later_calls_rpc``).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from judge_cases import Case, assert_caught, case_id

from chaos import history, history_check
from chaos.history_check import HistoryViolation
from chaos.planted_judges import PlantedJudge, planted_in
from chaos.recording import UNKNOWN, CallRecord
from chaos.targets import history as target_history
from chaos.targets.run import TargetRecord

Event = dict[str, Any]


def inv(i: int, expected: str | None = "", **kw: Any) -> Event:
    """Call ``i``'s invoke; its model value is ``'v<i>'`` (args differ from it on purpose)."""
    want = f"'v{i}'" if expected == "" else expected
    return {"op": "invoke", "call": i, "t": 100 + i, "method": "echo", "args": f"({i},)",
            "non_block": True, "timeout": 1.0, "expected": want, **kw}


def ok(i: int, seq: int, value: str | None = None, t: int | None = None) -> Event:
    return {"op": "ok", "call": i, "t": 1000 + 10 * seq if t is None else t, "seq": seq,
            "value": f"'v{i}'" if value is None else value}


def failed(i: int, seq: int, error: str, op: str = "fail", t: int | None = None) -> Event:
    return {"op": op, "call": i, "t": 1000 + 10 * seq if t is None else t, "seq": seq,
            "error": error, "message": f"{error}: ..."}


def ran(i: int, rank: int = 0, incarnation: int = 0, replay: bool = False, t: int = 500) -> Event:
    return {"op": "exec_start", "call": i, "t": t, "rank": rank, "pid": 4000 + 10 * rank + incarnation,
            "incarnation": incarnation, "replay": replay, "rpc_id": i + 1}


def only(events: list[Event], kind: str) -> HistoryViolation:
    """The one violation of ``events``; it must be of ``kind``."""
    found = history_check.check(events)
    assert [v.kind for v in found] == [kind], found
    return found[0]


def quiet(events: list[Event]) -> None:
    found = history_check.check(events)
    assert found == [], found


# ------------------------------------------------------------------ never_completed


def fire_never_completed() -> None:
    events = [inv(0), inv(1), ok(0, 0)]
    assert only(events, "never_completed").ops == (events[1],)


def quiet_an_info_outcome_is_a_completion() -> None:
    quiet([inv(0), inv(1), ok(0, 0), failed(1, 1, "ExecutorFailedError", op="info")])


# ------------------------------------------------------------------ values


def fire_wrong_value() -> None:
    events = [inv(0), inv(1), ok(0, 0, value="'garbage'"), ok(1, 1)]
    assert only(events, "wrong_value").ops == (events[0], events[2])


def quiet_the_models_value() -> None:
    quiet([inv(0), inv(1), ok(0, 0), ok(1, 1)])


def quiet_a_model_that_does_not_know() -> None:
    quiet([inv(0, expected=None), inv(1), ok(0, 0, value="'garbage'"), ok(1, 1)])


def fire_reply_to_other_a_later_calls_value() -> None:
    events = [inv(0), inv(1), ok(0, 0, value="'v1'"), ok(1, 1)]
    assert only(events, "reply_to_other").ops == (events[0], events[2], events[1])


def fire_reply_to_other_an_earlier_calls_value() -> None:
    events = [inv(0), inv(1), ok(0, 0), ok(1, 1, value="'v0'")]
    assert only(events, "reply_to_other").ops == (events[1], events[3], events[0])


def quiet_a_failed_call_has_no_value_to_judge() -> None:
    quiet([inv(0), inv(1), failed(0, 0, "WorkerError"), ok(1, 1)])


# ------------------------------------------------------------------ out_of_order

def _overtaken(first: Event) -> list[Event]:
    """Call 1 completes (seq 0) before call 0, which ends with ``first`` (seq 1)."""
    return [inv(0), inv(1), ok(1, 0), first]


def fire_overtaken_then_an_ordinary_failure() -> None:
    events = _overtaken(failed(0, 1, "WorkerError"))
    assert only(events, "out_of_order").ops == (events[0], events[1], events[2], events[3])


def fire_overtaken_then_the_executor_failed() -> None:
    events = _overtaken(failed(0, 1, "ExecutorFailedError", op="info"))
    assert only(events, "out_of_order").ops == (events[0], events[1], events[2], events[3])


def quiet_overtaken_then_ctrl_c() -> None:
    quiet(_overtaken(failed(0, 1, "KeyboardInterrupt", op="info")))


def quiet_overtaken_then_its_deadline() -> None:
    quiet(_overtaken(failed(0, 1, "TimeoutError", op="info")))


def quiet_the_rest_in_order_around_a_deadline() -> None:
    """Call 0 ends by its deadline last; calls 1 and 2 complete in their order (seq 0, 1)."""
    quiet([inv(0), inv(1), inv(2), ok(1, 0), ok(2, 1), failed(0, 2, "TimeoutError", op="info")])


def quiet_overtaken_then_refused_before_the_queue() -> None:
    quiet(_overtaken(failed(0, 1, "QueueFullError")))
    quiet(_overtaken(failed(0, 1, "RequestPicklingError")))


def quiet_a_callbacks_call_overtaken() -> None:
    events = _overtaken(ok(0, 1))
    events[0] = {**events[0], "check": "callbacks"}
    quiet(events)


def quiet_in_seq_order_though_end_times_are_not() -> None:
    """``seq`` is the order calls completed in; the wall clock of two threads may disagree."""
    quiet([inv(0), inv(1), ok(0, 0, t=2000), ok(1, 1, t=1500)])


def fire_in_end_time_order_though_seq_is_not() -> None:
    events = [inv(0), inv(1), ok(1, 0, t=2500), ok(0, 1, t=2000)]
    assert only(events, "out_of_order").ops == (events[0], events[1], events[2], events[3])


def fire_each_overtaken_call_once_naming_its_first_overtaker() -> None:
    """Calls 0, 1, 2 complete in reverse: call 0 overtaken first by call 1, call 1 by call 2."""
    events = [inv(0), inv(1), inv(2), ok(2, 0), ok(1, 1), ok(0, 2)]
    found = history_check.check(events)
    assert [v.kind for v in found] == ["out_of_order", "out_of_order"], found
    assert found[0].ops == (events[0], events[1], events[4], events[5])
    assert found[1].ops == (events[1], events[2], events[3], events[4])


# ------------------------------------------------------------------ executed_twice


def _run_twice(second: Event) -> list[Event]:
    return [inv(0), ran(0, rank=1, t=300), second, ok(0, 0)]


def fire_executed_twice_in_one_incarnation() -> None:
    events = _run_twice(ran(0, rank=1, t=400))
    assert only(events, "executed_twice").ops == (events[0], events[1], events[2])
    assert history_check.replays(events) == 0


def quiet_run_again_in_a_new_incarnation() -> None:
    quiet(_run_twice(ran(0, rank=1, incarnation=1, t=400)))


def quiet_a_broadcast_runs_once_on_each_rank() -> None:
    quiet(_run_twice(ran(0, rank=0, t=400)))


def quiet_a_marked_replay_is_counted() -> None:
    events = _run_twice(ran(0, rank=1, replay=True, t=400))
    quiet(events)
    assert history_check.replays(events) == 1


# ------------------------------------------------------------------ executed_after_fail


def fire_ran_after_queue_full() -> None:
    events = [inv(0), failed(0, 0, "QueueFullError", t=150), ran(0, rank=1, t=300)]
    assert only(events, "executed_after_fail").ops == (events[0], events[1], events[2])


def fire_ran_after_an_unpicklable_request() -> None:
    events = [inv(0), failed(0, 0, "RequestPicklingError", t=150), ran(0, t=300)]
    assert only(events, "executed_after_fail").ops == (events[0], events[1], events[2])


def quiet_a_slower_rank_runs_a_call_that_got_a_worker_error() -> None:
    """A broadcast fails at rank 0's error reply; rank 1 starts it afterwards."""
    quiet([inv(0), ran(0, rank=0, t=120), failed(0, 0, "WorkerError", t=150),
           ran(0, rank=1, t=300)])


def quiet_a_worker_runs_a_call_whose_refusal_is_unknown() -> None:
    """The same refusal as ``info`` (a target's report): unknown, so no claim about workers."""
    quiet([inv(0), failed(0, 0, "QueueFullError", op="info", t=150), ran(0, rank=1, t=300)])


# ------------------------------------------------------------------ chaos.history: info / fail

INFO = ("TimeoutError", "ExecutorFailedError", "KeyboardInterrupt")
FAIL = ("WorkerError", "CorruptMessageError", "QueueFullError", "RequestPicklingError",
        "ReplyUnpicklingError", "QueueCorruptedError")


def record(i: int, error: str = "", value: Any = None, seq: int | None = None) -> CallRecord:
    """Call ``i`` of ``echo('v<i>')``: ok with ``value`` or failed with ``error``."""
    c = CallRecord(index=i, method="echo", args=(f"v{i}",), timeout=1.0, non_block=True,
                   unique_reply_rank=None, expected=f"v{i}", start_ns=100 + i, start=0.0,
                   end_ns=1000 + i, resolved_seq=i if seq is None else seq)
    if error:
        c.outcome, c.error_type, c.error = "error", error, f"{error}: ..."
    else:
        c.outcome, c.value = "ok", f"v{i}" if value is None else value
    return c


def _recorded_as(error: str, op: str) -> Case:
    def case() -> None:
        events = history.call_events([record(0, error)])
        assert [(e["op"], e.get("error")) for e in events] == [("invoke", None), (op, error)]
    case.__name__ = f"{'quiet' if op == 'info' else 'fire'}_{error}_is_recorded_{op}"
    return case


def fire_a_recorded_queue_full_then_ran() -> None:
    events = [*history.call_events([record(0, "QueueFullError")]), ran(0, t=5000)]
    assert only(events, "executed_after_fail").ops == (events[0], events[1], events[2])


def quiet_a_recorded_deadline_then_ran() -> None:
    quiet([*history.call_events([record(0, "TimeoutError")]), ran(0, t=5000)])


def quiet_a_recorded_ctrl_c_overtaken() -> None:
    quiet(history.call_events([record(0, "KeyboardInterrupt", seq=1), record(1, seq=0)]))


def fire_a_recorded_worker_error_overtaken() -> None:
    events = history.call_events([record(0, "WorkerError", seq=1), record(1, seq=0)])
    assert only(events, "out_of_order").ops == (events[0], events[2], events[3], events[1])


def quiet_a_recorded_history_of_right_values() -> None:
    events = history.call_events([record(0), record(1), record(2)])
    assert [e["op"] for e in events] == ["invoke", "ok"] * 3
    quiet(events)


def fire_a_recorded_wrong_value() -> None:
    events = history.call_events([record(0, value="v9")])
    assert only(events, "wrong_value").ops == (events[0], events[1])
    assert events[1]["value"] == "'v9'" and events[0]["expected"] == "'v0'"


def quiet_a_recorded_unknown_model() -> None:
    c = record(0, value="anything")
    c.expected = UNKNOWN
    events = history.call_events([c])
    assert events[0]["expected"] is None
    quiet(events)


# ------------------------------------------------------------------ chaos.history: RPC -> call


def rpc_span(rpc_id: int, start_ns: int) -> SimpleNamespace:
    """The driver's "rpc echo" span as _calls_by_rpc reads it."""
    return SimpleNamespace(name="rpc echo", start_ns=start_ns,
                           attributes={"rpc.method": "echo", "faultlab.rpc_id": rpc_id})


def _timed(c: CallRecord, start_ns: int, end_ns: int) -> CallRecord:
    c.start_ns, c.end_ns = start_ns, end_ns
    return c


def _after_a_refusal(ran_rpcs: list[int]) -> list[Event]:
    """Call 0 ok (rpc 1); call 1 refused before an rpc id was drawn (a hostile argument
    refused by check_call, as the edge workloads send; or an executor already failed): no
    span; call 2 refused by a full queue (rpc 2, sent nowhere); call 3 ok (rpc 3).  Workers
    ran the rpcs ``ran_rpcs``; each execution is given the call its rpc maps to."""
    calls = [_timed(record(0, seq=0), 100, 200),
             _timed(record(1, "ValueError", seq=1), 300, 310),
             _timed(record(2, "QueueFullError", seq=2), 400, 500),
             _timed(record(3, seq=3), 600, 700)]
    call_of = history._calls_by_rpc([rpc_span(1, 105), rpc_span(2, 405), rpc_span(3, 605)],
                                    calls)
    return [*history.call_events(calls),
            *(ran(call_of[rpc], t=10 * rpc + 100 * rpc) for rpc in ran_rpcs)]


def quiet_a_refused_call_takes_no_later_calls_rpc() -> None:
    events = _after_a_refusal([1, 3])
    assert [e["call"] for e in events if e["op"] == "exec_start"] == [0, 3]
    quiet(events)


def fire_the_full_queues_own_rpc_ran() -> None:
    events = _after_a_refusal([1, 2])
    found = only(events, "executed_after_fail")
    assert [(e["op"], e["call"]) for e in found.ops] == [("invoke", 2), ("fail", 2),
                                                          ("exec_start", 2)]


# ------------------------------------------------------------------ target histories


def target(name: str = "faultlab", **calls: dict[str, Any]) -> TargetRecord:
    """Calls 0, 1, 2 invoked at 100, 200, 300 and returned 10 * id at 1100, 1200, 1300."""
    base = {i: {"what": "work", "invoke_ns": 100 * (i + 1), "end_ns": 1000 + 100 * (i + 1),
                "outcome": "ok", "value": 10 * i} for i in range(3)}
    for key, change in calls.items():
        base[int(key.removeprefix("c"))].update(change)
    return TargetRecord(target=name, scenario="s", seed=1, fault_kind="kill", spec={},
                        started=True, calls=base, driver_end_ns=5000)


EXPECTED = {0: 0, 1: 10, 2: 20}


def _by_call(events: list[Event], op: str) -> dict[int, Event]:
    return {e["call"]: e for e in events if e["op"] == op}


def fire_an_ordered_target_overtaken() -> None:
    events = target_history.build(target(c0={"end_ns": 1250}), EXPECTED)
    invokes, oks = _by_call(events, "invoke"), _by_call(events, "ok")
    assert only(events, "out_of_order").ops == (invokes[0], invokes[1], oks[1], oks[0])


def quiet_a_target_that_promises_no_order_overtaken() -> None:
    events = target_history.build(target("processpool", c0={"end_ns": 1250}), EXPECTED)
    assert all(e.get("seq") is None for e in events)
    quiet(events)


def fire_an_ordered_target_overtaken_by_a_failure() -> None:
    events = target_history.build(target(c1={"end_ns": 1050, "outcome": "fail",
                                             "type": "RuntimeError", "message": "boom"}), EXPECTED)
    found = only(events, "out_of_order")
    assert [(e["op"], e["call"]) for e in found.ops] == [("invoke", 0), ("invoke", 1),
                                                          ("info", 1), ("ok", 0)]


def quiet_a_target_value_with_its_keys_in_another_order() -> None:
    record = target(c0={"value": {"b": 2, "a": 1}})
    quiet(target_history.build(record, {**EXPECTED, 0: {"a": 1, "b": 2}}))


def fire_a_target_wrong_value() -> None:
    events = target_history.build(target(c0={"value": {"b": 3, "a": 1}}),
                                  {**EXPECTED, 0: {"a": 1, "b": 2}})
    assert only(events, "wrong_value").ops == (_by_call(events, "invoke")[0],
                                               _by_call(events, "ok")[0])


def fire_a_target_reply_to_other() -> None:
    events = target_history.build(target(c2={"value": 10}), EXPECTED)
    invokes = _by_call(events, "invoke")
    assert only(events, "reply_to_other").ops == (invokes[2], _by_call(events, "ok")[2], invokes[1])


def quiet_a_target_without_a_reference() -> None:
    quiet(target_history.build(target(c2={"value": 10}), None))


def _in_flight(ended_by: str | None) -> TargetRecord:
    record = target(c2={"outcome": "pending", "end_ns": None})
    record.ended_by = ended_by
    return record


def fire_a_target_driver_that_exited_with_a_call_in_flight() -> None:
    events = target_history.build(_in_flight(None), EXPECTED)
    assert only(events, "never_completed").ops == (_by_call(events, "invoke")[2],)


def quiet_a_target_driver_ended_with_a_call_in_flight() -> None:
    events = target_history.build(_in_flight("fault"), EXPECTED)
    assert _by_call(events, "info")[2] == {
        "op": "info", "call": 2, "t": 5000, "seq": None, "error": target_history.DRIVER_ENDED,
        "message": "the driver was ended (fault) while the call ran"}
    quiet(events)


def quiet_a_target_failure_is_unknown() -> None:
    """A target's failed call is info, whatever its error: a worker running it says nothing."""
    events = target_history.build(target(c1={"outcome": "fail", "type": "QueueFullError",
                                             "message": "full"}), EXPECTED)
    assert _by_call(events, "info")[1]["error"] == "QueueFullError"
    assert not _by_call(events, "fail")
    quiet([*events, ran(1, t=1500)])


CASES: list[Case] = [
    fire_never_completed, quiet_an_info_outcome_is_a_completion,
    fire_wrong_value, quiet_the_models_value, quiet_a_model_that_does_not_know,
    fire_reply_to_other_a_later_calls_value, fire_reply_to_other_an_earlier_calls_value,
    quiet_a_failed_call_has_no_value_to_judge,
    fire_overtaken_then_an_ordinary_failure, fire_overtaken_then_the_executor_failed,
    quiet_overtaken_then_ctrl_c, quiet_overtaken_then_its_deadline,
    quiet_the_rest_in_order_around_a_deadline,
    quiet_overtaken_then_refused_before_the_queue, quiet_a_callbacks_call_overtaken,
    quiet_in_seq_order_though_end_times_are_not, fire_in_end_time_order_though_seq_is_not,
    fire_each_overtaken_call_once_naming_its_first_overtaker,
    fire_executed_twice_in_one_incarnation, quiet_run_again_in_a_new_incarnation,
    quiet_a_broadcast_runs_once_on_each_rank, quiet_a_marked_replay_is_counted,
    fire_ran_after_queue_full, fire_ran_after_an_unpicklable_request,
    quiet_a_slower_rank_runs_a_call_that_got_a_worker_error,
    quiet_a_worker_runs_a_call_whose_refusal_is_unknown,
    *(_recorded_as(error, "info") for error in INFO),
    *(_recorded_as(error, "fail") for error in FAIL),
    fire_a_recorded_queue_full_then_ran, quiet_a_recorded_deadline_then_ran,
    quiet_a_recorded_ctrl_c_overtaken, fire_a_recorded_worker_error_overtaken,
    quiet_a_recorded_history_of_right_values, fire_a_recorded_wrong_value,
    quiet_a_recorded_unknown_model, quiet_a_refused_call_takes_no_later_calls_rpc,
    fire_the_full_queues_own_rpc_ran,
    fire_an_ordered_target_overtaken, quiet_a_target_that_promises_no_order_overtaken,
    fire_an_ordered_target_overtaken_by_a_failure,
    quiet_a_target_value_with_its_keys_in_another_order, fire_a_target_wrong_value,
    fire_a_target_reply_to_other, quiet_a_target_without_a_reference,
    fire_a_target_driver_that_exited_with_a_call_in_flight,
    quiet_a_target_driver_ended_with_a_call_in_flight, quiet_a_target_failure_is_unknown,
]


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_case(case: Case) -> None:
    case()


@pytest.mark.parametrize("judge", planted_in("history"), ids=lambda j: j.name)
def test_planted_judge_is_caught(judge: PlantedJudge) -> None:
    assert_caught(judge, CASES)


def test_every_case_passes_unplanted_and_names_are_unique() -> None:
    names = [case_id(c) for c in CASES]
    assert len(names) == len(set(names))
    assert all(n.startswith(("fire_", "quiet_")) for n in names)


def test_every_case_written_is_listed() -> None:
    written = {name for name, f in globals().items()
               if name.startswith(("fire_", "quiet_")) and callable(f)}
    assert written <= {case_id(c) for c in CASES}, written - {case_id(c) for c in CASES}


def test_each_plant_is_caught_by_the_case_written_for_it() -> None:
    """Not only some case: the one that proves the check the plant breaks."""
    from judge_cases import caught_by

    for judge, must in WANTED.items():
        failed = caught_by(_plant(judge), CASES)
        assert must in failed, f"{judge}: {must} not among {failed}"


def _plant(name: str) -> PlantedJudge:
    return next(j for j in planted_in("history") if j.name == name)


WANTED: dict[str, str] = {
    "history.info_is_no_completion": "quiet_an_info_outcome_is_a_completion",
    "history.unknown_model_judged": "quiet_a_model_that_does_not_know",
    "history.reply_owner_earlier_only": "fire_reply_to_other_a_later_calls_value",
    "history.reply_ops_miss_other": "fire_reply_to_other_an_earlier_calls_value",
    "history.order_exempts_every_error": "fire_overtaken_then_an_ordinary_failure",
    "history.order_exempts_every_info": "fire_overtaken_then_the_executor_failed",
    "history.order_deadline_not_exempt": "quiet_overtaken_then_its_deadline",
    "history.order_ctrl_c_not_exempt": "quiet_overtaken_then_ctrl_c",
    "history.order_by_wall_clock": "quiet_in_seq_order_though_end_times_are_not",
    "history.order_seq_against_own_index": "quiet_the_rest_in_order_around_a_deadline",
    "history.after_fail_ops_miss_run": "fire_ran_after_queue_full",
    "history.order_first_pair_only": "fire_each_overtaken_call_once_naming_its_first_overtaker",
    "history.twice_ignores_incarnation": "quiet_run_again_in_a_new_incarnation",
    "history.twice_ignores_rank": "quiet_a_broadcast_runs_once_on_each_rank",
    "history.replay_flag_ignored": "quiet_a_marked_replay_is_counted",
    "history.never_sent_includes_worker_error":
        "quiet_a_slower_rank_runs_a_call_that_got_a_worker_error",
    "history.never_sent_ignores_op": "quiet_a_worker_runs_a_call_whose_refusal_is_unknown",
    "history.queue_full_is_info": "fire_a_recorded_queue_full_then_ran",
    "history.ctrl_c_is_fail": "quiet_KeyboardInterrupt_is_recorded_info",
    "history.rpc_match_ignores_end": "quiet_a_refused_call_takes_no_later_calls_rpc",
    "history.target_processpool_ordered": "quiet_a_target_that_promises_no_order_overtaken",
    "history.target_order_by_invoke": "fire_an_ordered_target_overtaken",
    "history.target_text_unsorted": "quiet_a_target_value_with_its_keys_in_another_order",
    "history.target_driver_ended_dropped": "quiet_a_target_driver_ended_with_a_call_in_flight",
    "history.target_failure_is_fail": "quiet_a_target_failure_is_unknown",
}
