"""Planted judges for the history checker (chaos.history_check), the history's info / fail
contract (chaos.history) and the target histories (chaos.targets.history).

    events ──_calls (COMPLETIONS)──► calls ──never_completed, values (_owner_of),
                                             out_of_order (_unordered, _overtook),
                                             executed_twice (_is_replay, _run_key),
                                             executed_after_fail (_never_sent)──► violations
    CallRecord ──call_events (INFO_ERRORS: info, else fail)──► events
    RPC spans ──_calls_by_rpc (_in_progress)──► the call of each execution
    TargetRecord ──build (completion_order, text, DriverEnded info)──► events

Each plant is one plausible slip in one of those: an exemption widened (every error, every
``info`` outcome exempt from the order check; WorkerError taken for never sent; an ``info``
refusal taken for a ``fail``), an exemption dropped (deadline, Ctrl-C, replay marks, a model
that does not know), a key that forgets a field (incarnation, rank), the wrong clock (wall
time in place of completion order; invoke time in place of end time), a search cut short
(only earlier calls own values; only the first overtaken call reported), a match too loose
(an RPC span given to a call that had already ended), ops that leave out the other call,
and a contract swapped (QueueFullError is a TimeoutError, so "info"; a Ctrl-C "fail"; a
target's failure "fail").  tests/judges/test_judges_history.py holds the fire /
quiet cases that catch every one.

Invariants: the judges look these attributes up at call time (module globals), so a plant
on ``chaos.history_check:X`` is what ``check`` runs; names start with ``history.``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

from chaos import history_check
from chaos.planted_judges import PlantedJudge
from chaos.targets import history as target_history

_CHECK = "chaos.history_check"
_HISTORY = "chaos.history"
_TARGET = "chaos.targets.history"
Events = list[dict[str, Any]]


def _without(name: str) -> Callable[[frozenset[str]], frozenset[str]]:
    return lambda original: original - {name}


def _with(name: str) -> Callable[[frozenset[str]], frozenset[str]]:
    return lambda original: original | {name}


def _every_error_unordered(original: Any) -> Callable[[Any], bool]:
    def _unordered(call: Any) -> bool:  # "any failure may come out of line"
        return call.done.get("error") is not None or bool(original(call))
    return _unordered


def _every_info_unordered(original: Any) -> Callable[[Any], bool]:
    def _unordered(call: Any) -> bool:  # "an unknown outcome has no place in line"
        return call.done["op"] == "info" or bool(original(call))
    return _unordered


def _never_sent_whatever_op(original: Any) -> Callable[[dict[str, Any]], bool]:
    def _never_sent(done: dict[str, Any]) -> bool:  # the error read, the op forgotten
        return done.get("error") in history_check.NEVER_SENT
    return _never_sent


def _rank_only(original: Any) -> Callable[[dict[str, Any]], tuple[Any, Any]]:
    return lambda execution: (execution.get("rank"), None)


def _incarnation_only(original: Any) -> Callable[[dict[str, Any]], tuple[Any, Any]]:
    return lambda execution: (None, execution.get("incarnation"))


def _replay_unread(original: Any) -> Callable[[dict[str, Any]], bool]:
    return lambda execution: False


def _by_wall_clock(original: Any) -> Callable[[Any, Any], bool]:
    def _overtook(earlier: Any, later: Any) -> bool:  # end times in place of ``seq``
        return bool(later.done["t"] < earlier.done["t"])
    return _overtook


def _against_own_index(original: Any) -> Callable[[Any, Any], bool]:
    def _overtook(earlier: Any, later: Any) -> bool:  # "completed before its place in line"
        return bool(later.done["seq"] < later.invoke["call"])
    return _overtook


def _after_fail_ops_without_run(original: Any) -> Callable[[Any], Any]:
    def executed_after_fail(calls: Any) -> Any:
        return [dataclasses.replace(v, ops=v.ops[:2]) for v in original(calls)]
    return executed_after_fail


def _first_only(original: Any) -> Callable[[Any], Any]:
    def out_of_order(calls: Any) -> Any:  # "the smallest showing": one pair for the history
        return original(calls)[:1]
    return out_of_order


def _earlier_owners_only(original: Any) -> Callable[[Any, int, dict[Any, list[int]]], int | None]:
    def _owner_of(value: Any, i: int, owners: dict[Any, list[int]]) -> int | None:
        return next((j for j in owners.get(value, []) if j < i), None)
    return _owner_of


def _reply_ops_without_other(original: Any) -> Callable[[Any], Any]:
    def values(calls: Any) -> Any:
        return [dataclasses.replace(v, ops=v.ops[:2]) if v.kind == "reply_to_other" else v
                for v in original(calls)]
    return values


def _unknown_model_judged(original: Any) -> Callable[[Any], Any]:
    def values(calls: Any) -> Any:  # the ``want is None`` skip dropped
        out = list(original(calls))
        for i, c in sorted(calls.items()):
            if c.invoke.get("expected") is None and c.done is not None and c.done["op"] == "ok":
                out.append(history_check.HistoryViolation("wrong_value", f"call {i} got {c.done['value']}; "
                                            "the model's value is None", (c.invoke, c.done)))
        return out
    return values


def _ordered_by_invoke(original: Any) -> Callable[[Any], dict[int, int]]:
    def completion_order(record: Any) -> dict[int, int]:  # invoke_ns in place of end_ns
        if record.target not in target_history.ORDERED:
            return {}
        ended = sorted((c.get("invoke_ns") or 0, i) for i, c in record.calls.items()
                       if c.get("outcome") in ("ok", "fail"))
        return {i: n for n, (_, i) in enumerate(ended)}
    return completion_order


def _unsorted_text(original: Any) -> Callable[[Any], str]:
    return lambda value: json.dumps(value, default=repr)


def _driver_ended_dropped(original: Any) -> Callable[..., Events]:
    def build(record: Any, expected: Any) -> Events:
        return [e for e in original(record, expected) if e.get("error") != "DriverEnded"]
    return build


def _started_by_then(original: Any) -> Callable[[Any, int], bool]:
    return lambda call, t_ns: bool(call.start_ns <= t_ns)  # "had started by then", no end


def _target_failure_is_fail(original: Any) -> Callable[..., Events]:
    def build(record: Any, expected: Any) -> Events:
        return [{**e, "op": "fail"} if e["op"] == "info" and e.get("error") != "DriverEnded"
                else e for e in original(record, expected)]
    return build


PLANTED: list[PlantedJudge] = [
    PlantedJudge("history.info_is_no_completion", f"{_CHECK}:COMPLETIONS",
                 "an info outcome is not taken for a completion: never_completed fires",
                 lambda original: ("ok", "fail")),
    PlantedJudge("history.unknown_model_judged", f"{_CHECK}:values",
                 "a call the model knows no value for is judged wrong_value anyway",
                 _unknown_model_judged),
    PlantedJudge("history.reply_owner_earlier_only", f"{_CHECK}:_owner_of",
                 "reply_to_other looks only at calls submitted before the one judged",
                 _earlier_owners_only),
    PlantedJudge("history.reply_ops_miss_other", f"{_CHECK}:values",
                 "reply_to_other's ops leave out the call whose value it got",
                 _reply_ops_without_other),
    PlantedJudge("history.order_exempts_every_error", f"{_CHECK}:_unordered",
                 "the Ctrl-C / deadline exemption widened to every failed call",
                 _every_error_unordered),
    PlantedJudge("history.order_exempts_every_info", f"{_CHECK}:_unordered",
                 "every info outcome (a failed executor too) exempt from the order check",
                 _every_info_unordered),
    PlantedJudge("history.order_deadline_not_exempt", f"{_CHECK}:_UNORDERED_ERRORS",
                 "a call ended by its deadline is held to submission order",
                 _without("TimeoutError")),
    PlantedJudge("history.order_ctrl_c_not_exempt", f"{_CHECK}:_UNORDERED_ERRORS",
                 "a call cut by Ctrl-C is held to submission order",
                 _without("KeyboardInterrupt")),
    PlantedJudge("history.order_by_wall_clock", f"{_CHECK}:_overtook",
                 "overtaking judged by completion wall time, not completion order (seq)",
                 _by_wall_clock),
    PlantedJudge("history.order_seq_against_own_index", f"{_CHECK}:_overtook",
                 "a call's completion place compared with its own submission index, not "
                 "with the earlier call's completion: an exempt call shifts every index",
                 _against_own_index),
    PlantedJudge("history.order_first_pair_only", f"{_CHECK}:out_of_order",
                 "only the first overtaken call is reported, not one per call overtaken",
                 _first_only),
    PlantedJudge("history.twice_ignores_incarnation", f"{_CHECK}:_run_key",
                 "executed_twice keyed by rank only: a new incarnation's re-run fires",
                 _rank_only),
    PlantedJudge("history.twice_ignores_rank", f"{_CHECK}:_run_key",
                 "executed_twice keyed by incarnation only: a broadcast's ranks fire",
                 _incarnation_only),
    PlantedJudge("history.replay_flag_ignored", f"{_CHECK}:_is_replay",
                 "replay: true is never read: a marked recovery replay fires, none counted",
                 _replay_unread),
    PlantedJudge("history.never_sent_includes_worker_error", f"{_CHECK}:NEVER_SENT",
                 "a WorkerError taken for never sent: a slower rank running it fires",
                 _with("WorkerError")),
    PlantedJudge("history.never_sent_ignores_op", f"{_CHECK}:_never_sent",
                 "never sent read from the error alone: an info refusal (unknown) fires",
                 _never_sent_whatever_op),
    PlantedJudge("history.after_fail_ops_miss_run", f"{_CHECK}:executed_after_fail",
                 "executed_after_fail's ops leave out the execution that ran the call",
                 _after_fail_ops_without_run),
    PlantedJudge("history.queue_full_is_info", f"{_HISTORY}:INFO_ERRORS",
                 "QueueFullError (a TimeoutError subclass) recorded info, not fail",
                 _with("QueueFullError")),
    PlantedJudge("history.ctrl_c_is_fail", f"{_HISTORY}:INFO_ERRORS",
                 "a Ctrl-C recorded fail (it did not happen), not info (unknown)",
                 _without("KeyboardInterrupt")),
    PlantedJudge("history.rpc_match_ignores_end", f"{_HISTORY}:_in_progress",
                 "an RPC span matched to any call started before it, ended or not: a "
                 "refused call (no span) takes the next call's executions",
                 _started_by_then),
    PlantedJudge("history.target_processpool_ordered", f"{_TARGET}:ORDERED",
                 "processpool (which promises no order) held to submission order",
                 _with("processpool")),
    PlantedJudge("history.target_order_by_invoke", f"{_TARGET}:completion_order",
                 "a target's completion order taken from invoke times, not end times",
                 _ordered_by_invoke),
    PlantedJudge("history.target_text_unsorted", f"{_TARGET}:text",
                 "values compared as JSON with their keys in the order they came",
                 _unsorted_text),
    PlantedJudge("history.target_driver_ended_dropped", f"{_TARGET}:build",
                 "a call in flight when the driver was ended gets no info: never_completed",
                 _driver_ended_dropped),
    PlantedJudge("history.target_failure_is_fail", f"{_TARGET}:build",
                 "a target's failed call recorded fail (did not happen), not info (unknown)",
                 _target_failure_is_fail),
]
