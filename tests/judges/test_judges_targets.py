"""The targets' grades and oracles, each proven on hand-made TargetRecords: a FIRE case and
a QUIET twin that differs in one fact, and every planted judge of area "targets" caught.

    record() ──one fact changed──► the grade / oracle / compare row ──► one assertion

Times are distinct on purpose: the driver was ready 1 s before the fault, the first failed
call ends 0.2 s after it, the error event 0.4 s after it; the bounds are bound_s 2, detect_s
0.5, exit_s 3 (a judge that reads the wrong event, clock or bound gives another verdict).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from judge_cases import assert_caught, case_id

from chaos.planted_judges import PlantedJudge, planted_in
from chaos.targets import compare, oracles
from chaos.targets.run import TargetRecord
from chaos.targets.scenario import TargetScenario

SEC = 1_000_000_000
T_FAULT = 1_000 * SEC
T_READY = T_FAULT - 1 * SEC
MS = 1_000_000
RANK_MSG = "worker rank 1 (pid 4242) was killed by SIGKILL"
PLAIN_MSG = "request failed"
FAULT: dict[str, Any] = {"kind": "kill", "role": "worker", "rank": 1, "pid": 4242,
                         "signal": "SIGKILL", "time_ns": T_FAULT, "alive_at_fault": [4242, 4243]}
BOUNDS = {"bound_s": 2.0, "detect_s": 0.5, "exit_s": 3.0}


def ok_call(i: int, invoke_ns: int, end_ns: int, value: Any = None) -> dict[str, Any]:
    return {"what": "work", "invoke_ns": invoke_ns, "end_ns": end_ns, "outcome": "ok",
            "value": i * 10 if value is None else value}


def fail_call(invoke_ns: int, end_ns: int, message: str = PLAIN_MSG) -> dict[str, Any]:
    return {"what": "work", "invoke_ns": invoke_ns, "end_ns": end_ns, "outcome": "fail",
            "type": "RuntimeError", "message": message}


def error(t: int, message: str = RANK_MSG) -> dict[str, Any]:
    return {"type": "RuntimeError", "message": message, "t": t}


EXPECTED = {0: 0, 1: 10, 2: 20}


def killed(**changes: Any) -> TargetRecord:
    """A worker killed mid-work: call 0 returned before it, calls 1 and 2 failed 0.2 s and
    0.3 s after it, the error event 0.4 s after it, done 0.5 s after it, exit 0."""
    record = TargetRecord(
        target="t", scenario="s", seed=1, fault_kind="kill", spec={}, started=True,
        started_ns=T_READY - SEC, ready_ns=T_READY, done_ns=T_FAULT + 500 * MS,
        fault=dict(FAULT),
        calls={0: ok_call(0, T_READY, T_READY + 100 * MS),
               1: fail_call(T_FAULT - 50 * MS, T_FAULT + 200 * MS),
               2: fail_call(T_FAULT + 250 * MS, T_FAULT + 300 * MS)},
        errors=[error(T_FAULT + 400 * MS, PLAIN_MSG)], driver_returncode=0,
        bounds=dict(BOUNDS), mid_work=True)
    return dataclasses.replace(record, **changes)


def clean(**changes: Any) -> TargetRecord:
    """A fault-free run: three calls returned their right values, done, exit 0."""
    record = TargetRecord(
        target="t", scenario="s", seed=1, fault_kind="none", spec={}, started=True,
        ready_ns=T_READY, done_ns=T_READY + SEC, fault={"kind": "none", "time_ns": None},
        calls={i: ok_call(i, T_READY + i * 100 * MS, T_READY + (i + 1) * 100 * MS)
               for i in range(3)},
        driver_returncode=0, bounds=dict(BOUNDS))
    return dataclasses.replace(record, **changes)


def unhurt(**changes: Any) -> TargetRecord:
    """A worker killed mid-work whose run nonetheless returned every right value."""
    base = {"fault_kind": "kill", "fault": dict(FAULT), "done_ns": T_FAULT + SEC, "mid_work": True}
    return clean(**(base | changes))


def kill_driver(**changes: Any) -> TargetRecord:
    """The driver killed: nothing left behind unless ``changes`` says so."""
    fault = {"kind": "kill_driver", "role": "driver", "rank": None, "pid": 4000,
             "signal": "SIGKILL", "time_ns": T_FAULT, "alive_at_fault": [4242]}
    return killed(fault_kind="kill_driver", fault=fault, errors=[], done_ns=None,
                  driver_returncode=-9, ended_by="fault", **changes)


ORPHAN = {"role": "worker", "rank": 1, "pid": 4242, "status": "sleeping"}
HELPER = {"role": "helper", "rank": None, "pid": 4300, "status": "sleeping"}
STUCK = {"what": "call(s) [2] still in flight 2 s after their invoke", "calls": [2],
         "bound_s": 2.0, "time_ns": T_FAULT + 2 * SEC,
         "procs": [{"role": "worker", "rank": 1, "pid": 4242, "status": "stopped"}]}


def kinds(found: list[Any]) -> list[str]:
    return [v.invariant for v in found]


# ------------------------------------------------------------------ caller_errors, detected


def fire_caller_errors_after_the_fault_earliest_first() -> None:
    seen = oracles.caller_errors(killed())
    assert [(e["ev"], e["t"] - T_FAULT) for e in seen] == [
        ("fail", 200 * MS), ("fail", 300 * MS), ("error", 400 * MS)]


def quiet_caller_errors_before_the_fault() -> None:
    record = killed(errors=[error(T_FAULT - 100 * MS)], calls={0: ok_call(0, T_READY, T_READY)})
    assert oracles.caller_errors(record) == []


def fire_caller_errors_tie_puts_the_error_event_first() -> None:
    record = killed(errors=[error(T_FAULT + 200 * MS)])
    assert [e["ev"] for e in oracles.caller_errors(record)][:2] == ["error", "fail"]


def fire_caller_errors_without_a_fault_counts_every_error() -> None:
    record = clean(errors=[error(T_READY + 50 * MS)])
    assert [e["ev"] for e in oracles.caller_errors(record)] == ["error"]


def fire_detected_error_after_the_fault() -> None:
    assert oracles.detected(killed()) is True


def quiet_detected_errors_only_before_the_fault() -> None:
    record = killed(errors=[error(T_FAULT - 100 * MS)], calls={0: ok_call(0, T_READY, T_READY)})
    assert oracles.detected(record) is False


def quiet_detected_no_fault_fired() -> None:
    assert oracles.detected(killed(fault=None)) is False


# ------------------------------------------------------------------ detection_latency_s


def fire_latency_fault_to_first_failed_call() -> None:
    assert oracles.detection_latency_s(killed()) == pytest.approx(0.2)


def fire_latency_fault_to_error_event_when_it_comes_first() -> None:
    record = killed(errors=[error(T_FAULT + 100 * MS)])
    assert oracles.detection_latency_s(record) == pytest.approx(0.1)


def quiet_latency_no_caller_error_after_the_fault() -> None:
    record = killed(errors=[error(T_FAULT - 100 * MS)], calls={0: ok_call(0, T_READY, T_READY)})
    assert oracles.detection_latency_s(record) is None


def quiet_latency_no_fault() -> None:
    assert oracles.detection_latency_s(killed(fault=None)) is None


# ------------------------------------------------------------------ cause_named


def fire_cause_error_event_wins_over_an_earlier_failed_call() -> None:
    assert oracles.cause_named(killed(errors=[error(T_FAULT + 400 * MS, RANK_MSG)])) == "rank"


def quiet_cause_error_event_wins_over_an_earlier_naming_call() -> None:
    calls = killed().calls | {1: fail_call(T_FAULT, T_FAULT + 200 * MS, RANK_MSG)}
    assert oracles.cause_named(killed(calls=calls)) == "generic"


def fire_cause_first_failed_call_without_an_error_event() -> None:
    calls = killed().calls | {1: fail_call(T_FAULT, T_FAULT + 200 * MS, RANK_MSG)}
    assert oracles.cause_named(killed(calls=calls, errors=[])) == "rank"


def quiet_cause_later_failed_call_naming_the_rank() -> None:
    calls = killed().calls | {2: fail_call(T_FAULT, T_FAULT + 300 * MS, RANK_MSG)}
    assert oracles.cause_named(killed(calls=calls, errors=[])) == "generic"


def quiet_cause_error_event_before_the_fault_is_not_graded() -> None:
    record = killed(errors=[error(T_FAULT - 100 * MS, RANK_MSG)])
    assert oracles.cause_named(record) == "generic"


def quiet_cause_nothing_reached_the_caller() -> None:
    assert oracles.cause_named(unhurt()) == "none"


def fire_cause_graded_against_the_faults_rank() -> None:
    record = killed(errors=[error(T_FAULT + 400 * MS, RANK_MSG.replace("rank 1", "rank 0"))])
    assert oracles.cause_named(record) == "worker"


# ------------------------------------------------------------------ grade_message


def fire_grade_rank_and_pid() -> None:
    assert oracles.grade_message("rank 1 (pid 4242) failed", rank=1, pid=4242) == "rank"


def quiet_grade_rank_without_how() -> None:
    assert oracles.grade_message("rank 1 failed", rank=1, pid=4242) == "worker"


def quiet_grade_another_rank() -> None:
    assert oracles.grade_message("rank 0 (pid 4242) failed", rank=1, pid=4242) == "worker"


def fire_grade_pid_only_is_worker() -> None:
    assert oracles.grade_message("pid 4242 was killed by SIGKILL", rank=1, pid=4242) == "worker"


def quiet_grade_another_pid_is_generic() -> None:
    assert oracles.grade_message("pid 999 exited", rank=1, pid=4242) == "generic"


def fire_grade_a_worker_died() -> None:
    assert oracles.grade_message("a worker died: request failed", rank=1, pid=4242) == "worker"


def quiet_grade_neither() -> None:
    assert oracles.grade_message("a worker said: request failed", rank=1, pid=4242) == "generic"


def fire_grade_any_rank_when_the_fault_has_none() -> None:
    assert oracles.grade_message("rank 3 (pid 7) failed", rank=None, pid=None) == "rank"


# ------------------------------------------------------------------ outcome


def fire_outcome_orphans_and_leftovers_is_orphans() -> None:
    record = kill_driver(orphans=[ORPHAN], leftovers=["/dev/shm/x"])
    assert oracles.outcome(record) == "orphans"


def fire_outcome_orphans_only() -> None:
    assert oracles.outcome(kill_driver(orphans=[ORPHAN])) == "orphans"


def fire_outcome_leftovers_only() -> None:
    assert oracles.outcome(kill_driver(leftovers=["/dev/shm/x"])) == "leftovers"


def quiet_outcome_kill_driver_clean_exit() -> None:
    assert oracles.outcome(kill_driver()) == "exit_clean"


def fire_outcome_hang_over_failed() -> None:
    assert oracles.outcome(killed(stuck=[STUCK]), EXPECTED) == "hang"


def quiet_outcome_failed() -> None:
    assert oracles.outcome(killed(), EXPECTED) == "failed"


def fire_outcome_wrong_result() -> None:
    calls = killed().calls | {0: ok_call(0, T_READY, T_READY, value=1)}
    assert oracles.outcome(killed(calls=calls), EXPECTED) == "wrong_result"


def fire_outcome_crashed_exit_code() -> None:
    assert oracles.outcome(unhurt(driver_returncode=1), EXPECTED) == "crashed"


def fire_outcome_crashed_no_done() -> None:
    assert oracles.outcome(unhurt(done_ns=None), EXPECTED) == "crashed"


def quiet_outcome_unaffected() -> None:
    assert oracles.outcome(unhurt(), EXPECTED) == "unaffected"


def quiet_outcome_ok() -> None:
    assert oracles.outcome(clean(), EXPECTED) == "ok"


def fire_outcome_start_failed_and_not_applicable() -> None:
    assert oracles.outcome(clean(started=False)) == "start_failed"
    assert oracles.outcome(clean(applicable=False, started=False)) == "not_applicable"


# ------------------------------------------------------------------ never_hung


def fire_never_hung_call_past_bound_s_within_detect_s() -> None:
    calls = {0: ok_call(0, T_READY, T_READY + 2_500 * MS)}
    record = clean(calls=calls, bounds={"bound_s": 2.0, "detect_s": 3.0, "exit_s": 3.0})
    assert kinds(oracles.never_hung(record)) == ["hang"]


def quiet_never_hung_call_within_bound_s_past_detect_s() -> None:
    calls = {0: ok_call(0, T_READY, T_READY + 1_000 * MS)}
    assert oracles.never_hung(clean(calls=calls)) == []


def quiet_never_hung_call_exactly_at_the_bound() -> None:
    calls = {0: ok_call(0, T_READY, T_READY + 2 * SEC)}
    assert oracles.never_hung(clean(calls=calls)) == []


def fire_never_hung_stuck_names_the_processes_once() -> None:
    calls = killed().calls | {2: fail_call(T_FAULT, T_FAULT + 3 * SEC)}
    found = oracles.never_hung(killed(stuck=[STUCK], calls=calls))
    assert len(found) == 1 and "worker rank 1 pid 4242 stopped" in str(found[0])


# ------------------------------------------------------------------ failure_detected


def quiet_failure_detected_within_detect_s() -> None:
    assert oracles.failure_detected(killed()) == []  # 0.2 s, detect_s 0.5


def quiet_failure_detected_latency_exactly_at_detect_s() -> None:
    calls = {0: ok_call(0, T_READY, T_READY + 100 * MS)}
    assert oracles.failure_detected(killed(calls=calls, errors=[error(T_FAULT + 500 * MS)])) == []


def fire_failure_detected_past_detect_s_within_exit_s() -> None:
    calls = {0: ok_call(0, T_READY, T_READY + 100 * MS)}
    found = oracles.failure_detected(killed(calls=calls, errors=[error(T_FAULT + SEC)]))
    assert kinds(found) == ["detection"] and "beyond the 0.5 s bound" in str(found[0])


def quiet_failure_detected_past_exit_s_within_detect_s() -> None:
    calls = {0: ok_call(0, T_READY, T_READY + 100 * MS)}
    bounds = {"bound_s": 0.5, "detect_s": 1.5, "exit_s": 0.5}
    assert oracles.failure_detected(killed(calls=calls, errors=[error(T_FAULT + SEC)],
                                           bounds=bounds)) == []


def fire_failure_detected_never_reached_the_caller() -> None:
    calls = {0: ok_call(0, T_READY, T_READY + 100 * MS),
             1: {"what": "work", "invoke_ns": T_FAULT - MS, "end_ns": None, "outcome": "pending"}}
    found = oracles.failure_detected(unhurt(calls=calls, done_ns=None, driver_returncode=-9))
    assert kinds(found) == ["detection"] and "never reached the caller" in str(found[0])


def quiet_failure_detected_death_masked() -> None:
    assert oracles.failure_detected(unhurt(), EXPECTED) == []


def fire_failure_detected_for_a_term() -> None:
    fault = FAULT | {"kind": "term", "signal": "SIGTERM"}
    record = unhurt(fault_kind="term", fault=fault, done_ns=None)
    assert kinds(oracles.failure_detected(record, EXPECTED)) == ["detection"]


def quiet_failure_detected_for_a_stop() -> None:
    fault = FAULT | {"kind": "stop", "signal": "SIGSTOP"}
    record = unhurt(fault_kind="stop", fault=fault, done_ns=None)
    assert oracles.failure_detected(record, EXPECTED) == []


def quiet_failure_detected_fault_not_applied() -> None:
    record = unhurt(fault=FAULT | {"error": "ProcessLookupError"}, done_ns=None)
    assert oracles.failure_detected(record, EXPECTED) == []


def quiet_failure_detected_workload_done_before_the_fault() -> None:
    record = unhurt(done_ns=T_FAULT - MS, calls={0: ok_call(0, T_READY, T_READY)},
                    driver_returncode=-9)
    assert oracles.failure_detected(record, None) == []


# ------------------------------------------------------------------ no_orphans, nothing_leaked


def fire_no_orphans_a_helper() -> None:
    found = oracles.no_orphans(kill_driver(orphans=[HELPER]))
    assert kinds(found) == ["orphan"]
    assert "helper pid 4300" in str(found[0]) and "3 s after" in str(found[0])
    assert "killed by the fault" in str(found[0])


def fire_no_orphans_each_one() -> None:
    assert kinds(oracles.no_orphans(kill_driver(orphans=[ORPHAN, HELPER]))) == ["orphan"] * 2


def quiet_no_orphans() -> None:
    assert oracles.no_orphans(kill_driver(leftovers=["/dev/shm/x"])) == []


def fire_nothing_leaked() -> None:
    found = oracles.nothing_leaked(kill_driver(leftovers=["/dev/shm/x"]))
    assert kinds(found) == ["leak"] and "/dev/shm/x" in str(found[0])


def quiet_nothing_leaked() -> None:
    assert oracles.nothing_leaked(kill_driver(orphans=[ORPHAN])) == []


# ------------------------------------------------------------------ results_correct


def fire_results_correct_a_wrong_value() -> None:
    calls = clean().calls | {1: ok_call(1, T_READY, T_READY, value=11)}
    found = oracles.results_correct(clean(calls=calls), EXPECTED)
    assert kinds(found) == ["results"] and "call 1 returned 11" in str(found[0])


def quiet_results_correct() -> None:
    assert oracles.results_correct(clean(), EXPECTED) == []


def quiet_results_correct_a_failed_call_is_not_a_value() -> None:
    calls = clean().calls | {1: fail_call(T_READY, T_READY) | {"value": 11}}
    assert oracles.results_correct(clean(calls=calls), EXPECTED) == []


def fire_results_correct_no_reference() -> None:
    assert kinds(oracles.results_correct(clean(), None)) == ["results"]


def quiet_results_correct_no_reference_no_value() -> None:
    calls = {0: fail_call(T_READY, T_READY)}
    assert oracles.results_correct(clean(calls=calls), None) == []


# ------------------------------------------------------------------ fault_free_stays_fault_free


def fire_fault_free_a_failed_call() -> None:
    calls = clean().calls | {2: fail_call(T_READY, T_READY)}
    assert kinds(oracles.fault_free_stays_fault_free(clean(calls=calls))) == ["fault_free"]


def quiet_fault_free_a_failed_call_under_a_fault() -> None:
    calls = clean().calls | {2: fail_call(T_READY, T_READY)}
    record = clean(calls=calls, fault_kind="kill", fault=dict(FAULT))
    assert oracles.fault_free_stays_fault_free(record) == []


def fire_fault_free_an_error_event() -> None:
    found = oracles.fault_free_stays_fault_free(clean(errors=[error(T_READY)]))
    assert kinds(found) == ["fault_free"] and "the caller saw RuntimeError" in str(found[0])


def quiet_fault_free() -> None:
    assert oracles.fault_free_stays_fault_free(clean()) == []


def fire_fault_free_unfinished() -> None:
    calls = clean().calls | {2: {"invoke_ns": T_READY, "end_ns": None, "outcome": "pending"}}
    found = oracles.fault_free_stays_fault_free(clean(calls=calls))
    assert kinds(found) == ["fault_free"] and "2 of 3 calls returned" in str(found[0])


def quiet_fault_free_unfinished_but_stuck() -> None:
    calls = clean().calls | {2: {"invoke_ns": T_READY, "end_ns": None, "outcome": "pending"}}
    assert oracles.fault_free_stays_fault_free(clean(calls=calls, stuck=[STUCK])) == []


def fire_fault_free_exit_code() -> None:
    found = oracles.fault_free_stays_fault_free(clean(driver_returncode=1))
    assert kinds(found) == ["fault_free"] and "exited with code 1" in str(found[0])


def quiet_fault_free_exit_code_of_the_observers_kill() -> None:
    assert oracles.fault_free_stays_fault_free(clean(driver_returncode=-9,
                                                     ended_by="deadline")) == []


# ------------------------------------------------------------------ started


def fire_started_no_ready() -> None:
    found = oracles.started(clean(started=False, ended_by="start"))
    assert kinds(found) == ["start"] and "no ready within its start timeout" in str(found[0])


def quiet_started() -> None:
    assert oracles.started(clean(ended_by="start")) == []


def quiet_started_not_applicable() -> None:
    assert oracles.started(clean(started=False, applicable=False)) == []


# ------------------------------------------------------------------ planned_faults_fired


def fire_unfired_no_fault() -> None:
    assert kinds(oracles.planned_faults_fired(killed(fault=None))) == ["unfired"]


def quiet_unfired_fault_free() -> None:
    assert oracles.planned_faults_fired(clean(fault=None)) == []


def fire_unfired_not_applied() -> None:
    found = oracles.planned_faults_fired(killed(fault=FAULT | {"error": "ProcessLookupError"}))
    assert kinds(found) == ["unfired"] and "ProcessLookupError" in str(found[0])


def quiet_unfired_fired() -> None:
    assert oracles.planned_faults_fired(killed()) == []


def fire_unfired_mid_work_fault_after_the_last_call() -> None:
    found = oracles.planned_faults_fired(killed(done_ns=T_FAULT - MS))
    assert kinds(found) == ["unfired"] and "meant to land mid-work" in str(found[0])


def quiet_unfired_idle_fault_after_the_last_call() -> None:
    assert oracles.planned_faults_fired(killed(done_ns=T_FAULT - MS, mid_work=False)) == []


def fire_unfired_kill_driver_nothing_alive() -> None:
    record = kill_driver()
    record.fault = (record.fault or {}) | {"alive_at_fault": []}
    assert kinds(oracles.planned_faults_fired(record)) == ["unfired"]


def quiet_unfired_kill_driver_something_alive() -> None:
    assert oracles.planned_faults_fired(kill_driver()) == []


# ------------------------------------------------------------------ check


def late_detection() -> TargetRecord:
    calls = {0: ok_call(0, T_READY, T_READY + 100 * MS)}
    return killed(calls=calls, errors=[error(T_FAULT + SEC)], leftovers=["/dev/shm/x"])


def fire_check_every_oracle_and_the_tolerated_split() -> None:
    violations, tolerated = oracles.check(late_detection(), EXPECTED, ("leak",))
    assert (kinds(violations), kinds(tolerated)) == (["detection"], ["leak"])


def quiet_check_nothing_tolerated() -> None:
    violations, tolerated = oracles.check(late_detection(), EXPECTED, ("hang",))
    assert (kinds(violations), kinds(tolerated)) == (["detection", "leak"], [])


def quiet_check_not_applicable() -> None:
    record = dataclasses.replace(late_detection(), applicable=False)
    assert oracles.check(record, EXPECTED) == ([], [])


# ------------------------------------------------------------------ compare's row


SCENARIO = TargetScenario(name="sigkill-rank1", fault="kill", bound_s=2.0, tolerate=("leak",))


def row(record: TargetRecord, scenario: TargetScenario = SCENARIO) -> dict[str, Any]:
    return compare.judge_record("faultlab", scenario, 7, record, EXPECTED, Path("d")).row()


def fire_row_fields_from_their_sources() -> None:
    record = late_detection()
    record.orphans = [ORPHAN]
    got = row(record)
    assert {k: got[k] for k in ("target", "scenario", "seed", "fault", "outcome", "detected",
                                "detection_latency_s", "cause_named", "leftovers")} == {
        "target": "faultlab", "scenario": "sigkill-rank1", "seed": 7, "fault": "kill",
        "outcome": "failed", "detected": True, "detection_latency_s": 1.0,
        "cause_named": "rank", "leftovers": ["/dev/shm/x"]}
    assert [(o["role"], o["pid"]) for o in got["orphans"]] == [("worker", 4242)]
    assert [v.split("]")[0] for v in got["violations"]] == ["[detection", "[orphan"]
    assert [v.split("]")[0] for v in got["tolerated"]] == ["[leak"]


def fire_row_latency_to_the_microsecond() -> None:
    record = killed(errors=[error(T_FAULT + 123_456)], calls={})
    assert row(record)["detection_latency_s"] == 0.000123


def quiet_row_error_without_a_fault_is_not_detected() -> None:
    got = row(clean(errors=[error(T_READY)]), dataclasses.replace(SCENARIO, fault="none"))
    assert (got["detected"], got["cause_named"], got["detection_latency_s"]) == (
        False, "rank", None)


def fire_row_note_says_what_happened_within_the_bound() -> None:
    record = killed(fault=FAULT | {"within_bound": "hang"}, note="record's own")
    assert row(record)["note"] == "within the 2 s bound: hang"


def quiet_row_note_is_the_records() -> None:
    assert row(killed(note="record's own"))["note"] == "record's own"


CASES = [case for name, case in sorted(globals().items())
         if name.startswith(("fire_", "quiet_")) and callable(case)]


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_case(case: Any) -> None:
    case()


@pytest.mark.parametrize("judge", planted_in("targets"), ids=lambda j: j.name)
def test_planted_judge_is_caught(judge: PlantedJudge) -> None:
    assert_caught(judge, CASES)


def test_every_case_is_a_pair() -> None:
    """Each family of judges has both kinds: cases that must fire and cases that must not."""
    fire = {c.__name__.split("_")[1] for c in CASES if c.__name__.startswith("fire_")}
    quiet = {c.__name__.split("_")[1] for c in CASES if c.__name__.startswith("quiet_")}
    assert fire == quiet, (fire ^ quiet)
