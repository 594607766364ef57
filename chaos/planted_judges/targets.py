"""Planted judges for the targets' grades and oracles (chaos.targets.oracles, .compare).

    TargetRecord ──oracles' grades (caller_errors, detected, detection_latency_s, cause_named,
                  grade_message, outcome)──► compare's row ◄──oracles (check: ORACLES by name)──

Each plant is one plausible slip in one of those judges: the wrong event graded (the last
failed call, the first event whatever its kind), the wrong clock (the latency reversed, from
ready, to the error event only), the wrong field (the exit or detection bound in place of
the right one), a widened or narrowed exemption (errors before the fault, a term not fatal,
a masked death that never finished, a fault that did not fire although not meant mid-work),
a precedence swapped (leftovers before orphans), a dropped look (a fault-free run's error
events) and a row's field from the wrong source (detected from the cause's grade).
tests/judges/test_judges_targets.py holds the fire/quiet cases that catch every one.

Invariants: plants reach judges through their module's globals (oracles calls its helpers
by name; compare calls ``oracles.X``), so a plant on ``chaos.targets.oracles:X`` is what
every caller runs; names start with ``targets.``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from chaos.oracles import Violation
from chaos.planted_judges import PlantedJudge
from chaos.targets import oracles
from chaos.targets.run import TargetRecord

_MODULE = "chaos.targets.oracles"
Oracle = Callable[[TargetRecord, Any], list[Violation]]


def _cause_from(pick: Callable[[list[dict[str, Any]]], dict[str, Any]]) -> Callable[[Any], Any]:
    def make(original: Any) -> Callable[[TargetRecord], str]:
        def cause_named(record: TargetRecord) -> str:
            errors = oracles.caller_errors(record)
            if not errors:
                return "none"
            fault = record.fault or {}
            first = pick(errors)
            return oracles.grade_message(f"{first['type']}: {first['message']}",
                                         fault.get("rank"), fault.get("pid"))
        return cause_named
    return make


def _last_failed_call(errors: list[dict[str, Any]]) -> dict[str, Any]:
    return next((e for e in errors if e["ev"] == "error"), errors[-1])


def _first_event(errors: list[dict[str, Any]]) -> dict[str, Any]:
    return errors[0]


def _rank_for_pid(original: Any) -> Callable[[str, int | None, int | None], str]:
    def grade_message(message: str, rank: int | None = None, pid: int | None = None) -> str:
        grade: str = original(message, rank, pid)
        if grade == "worker" and oracles._names_how(message, pid):
            return "rank"  # a pid or a signal taken for the rank
        return grade
    return grade_message


def _latency_reversed(original: Any) -> Callable[[TargetRecord], float | None]:
    def detection_latency_s(record: TargetRecord) -> float | None:
        latency = original(record)
        return None if latency is None else -float(latency)
    return detection_latency_s


def _latency_to_error_event(original: Any) -> Callable[[TargetRecord], float | None]:
    def detection_latency_s(record: TargetRecord) -> float | None:
        fault_ns = record.fault_ns()
        events = [e for e in oracles.caller_errors(record) if e["ev"] == "error"]
        if fault_ns is None or not events:
            return None
        return float((events[0]["t"] - fault_ns) / 1e9)
    return detection_latency_s


def _latency_from_ready(original: Any) -> Callable[[TargetRecord], float | None]:
    def detection_latency_s(record: TargetRecord) -> float | None:
        errors = oracles.caller_errors(record)
        if record.fault_ns() is None or not errors or record.ready_ns is None:
            return None
        return float((errors[0]["t"] - record.ready_ns) / 1e9)
    return detection_latency_s


def _errors_before_fault(original: Any) -> Callable[[TargetRecord], list[dict[str, Any]]]:
    def caller_errors(record: TargetRecord) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = original(dataclasses.replace(record, fault=None))
        return result  # every error of the run, not only those at or after the fault
    return caller_errors


def _leftovers_first(original: Any) -> Callable[[TargetRecord], str]:
    def kill_driver_outcome(record: TargetRecord) -> str:
        return "leftovers" if record.leftovers else "orphans" if record.orphans else "exit_clean"
    return kill_driver_outcome


def _with_bound(bound: str, read_as: str) -> Callable[[Any], Oracle]:
    """The oracle run with its ``bound`` read from the record's ``read_as`` bound."""
    def make(original: Any) -> Oracle:
        def oracle(record: TargetRecord, expected: Any = None) -> list[Violation]:
            bounds = {**record.bounds, bound: record.bounds.get(read_as, 5.0)}
            result: list[Violation] = original(dataclasses.replace(record, bounds=bounds),
                                               expected)
            return result
        oracle.__name__ = original.__name__
        return oracle
    return make


def _masked_if_not_wrong(original: Any) -> Callable[[TargetRecord, Any], bool]:
    def all_correct(record: TargetRecord, expected: Any) -> bool:
        return not oracles._wrong(record, expected)  # no wrong value taken for every right one
    return all_correct


def _unfired_always_mid_work(original: Any) -> Oracle:
    def planned_faults_fired(record: TargetRecord, expected: Any = None) -> list[Violation]:
        result: list[Violation] = original(dataclasses.replace(record, mid_work=True), expected)
        return result
    return planned_faults_fired


def _fault_free_ignores_errors(original: Any) -> Oracle:
    def fault_free_stays_fault_free(record: TargetRecord,
                                    expected: Any = None) -> list[Violation]:
        result: list[Violation] = original(dataclasses.replace(record, errors=[]), expected)
        return result
    return fault_free_stays_fault_free


def _detected_from_cause(original: Any) -> Callable[..., Any]:
    def judge_record(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        result.detected = result.cause_named != "none"  # any graded error, fault or not
        return result
    return judge_record


PLANTED: list[PlantedJudge] = [
    PlantedJudge("targets.cause_from_last_failed_call", f"{_MODULE}:cause_named",
                 "with no error event, grades the last failed call instead of the first",
                 _cause_from(_last_failed_call)),
    PlantedJudge("targets.cause_from_first_event", f"{_MODULE}:cause_named",
                 "grades the earliest caller error whatever its kind: an earlier failed call "
                 "beats the error event", _cause_from(_first_event)),
    PlantedJudge("targets.rank_for_pid_only", f"{_MODULE}:grade_message",
                 "grades \"rank\" a message that names the pid or the signal but no rank",
                 _rank_for_pid),
    PlantedJudge("targets.latency_reversed", f"{_MODULE}:detection_latency_s",
                 "detection latency is fault time − first error (negative)", _latency_reversed),
    PlantedJudge("targets.latency_to_error_event", f"{_MODULE}:detection_latency_s",
                 "detection latency runs to the first error event, ignoring earlier failed "
                 "calls", _latency_to_error_event),
    PlantedJudge("targets.latency_from_ready", f"{_MODULE}:detection_latency_s",
                 "detection latency measured from the driver's ready, not from the fault",
                 _latency_from_ready),
    PlantedJudge("targets.errors_before_fault_count", f"{_MODULE}:caller_errors",
                 "caller errors from before the fault count as its detection",
                 _errors_before_fault),
    PlantedJudge("targets.leftovers_before_orphans", f"{_MODULE}:_kill_driver_outcome",
                 "a killed driver's run with orphans and leftovers is called \"leftovers\"",
                 _leftovers_first),
    PlantedJudge("targets.detect_against_exit_bound", f"{_MODULE}:failure_detected",
                 "failure_detected compares the latency with exit_s instead of detect_s",
                 _with_bound("detect_s", "exit_s")),
    PlantedJudge("targets.hang_against_detect_bound", f"{_MODULE}:never_hung",
                 "never_hung compares a call's duration with detect_s instead of bound_s",
                 _with_bound("bound_s", "detect_s")),
    PlantedJudge("targets.term_not_fatal", f"{_MODULE}:WORKER_FATAL",
                 "only a kill is fatal to a worker: a SIGTERM's detection is never checked",
                 lambda original: ("kill",)),
    PlantedJudge("targets.masked_without_finishing", f"{_MODULE}:_all_correct",
                 "a death counts as masked when no returned value is wrong, though calls "
                 "never returned", _masked_if_not_wrong),
    PlantedJudge("targets.unfired_ignores_mid_work", f"{_MODULE}:planned_faults_fired",
                 "a fault after the last call is unfired even when it was not meant mid-work",
                 _unfired_always_mid_work),
    PlantedJudge("targets.fault_free_ignores_errors", f"{_MODULE}:fault_free_stays_fault_free",
                 "a fault-free run's error events are not looked at, only failed calls",
                 _fault_free_ignores_errors),
    PlantedJudge("targets.row_detected_from_cause", "chaos.targets.compare:judge_record",
                 "the row's detected is \"some error was graded\", not \"a fault fired and "
                 "an error came after it\"", _detected_from_cause),
]
