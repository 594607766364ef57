"""The recovery scenario's judges (chaos.recovery's oracles, the skewed restart's oracles of
chaos.skewed_restart), each proven on a hand-made run: a FIRE case and a QUIET twin that
differs in one fact, and every planted judge of area "recovery" caught.  No process starts.

    _FaultedRun (fields set by hand) ──_judge / _oracles / skewed_restart.violations──► [Violation]

Times and bounds differ on purpose: the fault at 4.0 s; two recoveries, the first's first
new token at 5.8 s (1.8 s after the fault), the second's at 7.3 s (3.3 s); the recovery
bound 2.5 s, the step timeout 1.0 s, the node timeout 10 s.  A judge that takes the last
recovery, or compares with the wrong bound, gives another verdict.  The skewed workers' own
token log is written by hand into a temporary directory.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from judge_cases import assert_caught, case_id

from chaos import recovery as rec
from chaos import skewed_restart
from chaos.planted_judges import planted_in
from chaos.run_record import Violation

REFERENCE = {"a": [5, 6, 7, 8], "b": [9, 10, 11, 12]}
FAULT_AT = 4.0
RESTART = rec.RecoveryScenario(name="judged", max_tokens=4, steps=(1, 2), step_timeout=1.0,
                               recovery_bound_s=2.5)
FAIL_STOP = rec.RecoveryScenario(name="judged", max_tokens=4, steps=(1, 2), policy="fail_stop")


def record(first_token_at: float | None, incarnation: int = 1) -> Any:
    return SimpleNamespace(first_token_at=first_token_at, incarnation=incarnation,
                           tokens_recomputed=3)


TWO_RECOVERIES = [record(5.8, 1), record(7.3, 2)]


def faulted(records: list[Any] | None = None, mismatches: int = 0, **fields: Any) -> Any:
    """A recovered run with the reference tokens; ``fields`` change what it recorded."""
    run = rec._FaultedRun(fields.pop("scenario", RESTART), 7, Path("/nonexistent/skew-flag"))
    recovery = SimpleNamespace(records=list(TWO_RECOVERIES if records is None else records),
                               mismatches=mismatches)
    run.engine = SimpleNamespace(recovery=recovery)
    run.fault_at, run.baseline = FAULT_AT, {k: list(v) for k, v in REFERENCE.items()}
    run.outputs = {k: list(v) for k, v in REFERENCE.items()}
    for name, value in fields.items():
        setattr(run, name, value)
    return run


def judged(run: Any, scenario: rec.RecoveryScenario = RESTART,
           leaks: tuple[str, ...] = ()) -> Any:
    return rec._judge(scenario, 7, Path("/nonexistent"), run, REFERENCE, list(leaks), 1.0)


def seen(violations: list[Violation]) -> list[str]:
    return [v.invariant for v in violations]


# -- a restart that recovered -----------------------------------------------------------------

def quiet_recovered_with_the_reference_tokens() -> None:
    result = judged(faulted())
    assert result.violations == [] and result.recovered
    assert result.detection_latency_s == pytest.approx(1.8)


def fire_one_request_short_of_its_tokens() -> None:  # the same tokens, one missing at the end
    outputs = {"a": [5, 6, 7], "b": [9, 10, 11, 12]}
    [v] = judged(faulted(outputs=outputs)).violations
    assert (v.invariant, v.message) == ("tokens", "request a: tokens differ from the fault-free run's")


def fire_one_rebuilt_token_differed() -> None:
    [v] = judged(faulted(mismatches=1)).violations
    assert (v.invariant, v.message) == ("tokens", "1 rebuilt token(s) differed")


def fire_a_request_did_not_finish() -> None:
    result = judged(faulted(errors={"b": "lost: retry budget spent"}))
    assert seen(result.violations) == ["finished"] and not result.recovered


def fire_the_engine_failed() -> None:  # every request done, yet the engine failed: no recovery
    result = judged(faulted(engine_error="engine failed: rank 1 died"))
    assert not result.recovered
    assert seen(result.violations) == ["recovered"]


def fire_no_recovery_recorded() -> None:
    [v] = judged(faulted(records=[])).violations
    assert v.invariant == "recovered"


def fire_the_layout_differs_from_tp1() -> None:
    baseline = {"a": [5, 6, 7, 8], "b": [9, 10, 11, 13]}
    assert seen(judged(faulted(baseline=baseline)).violations) == ["tokens"]


def fire_no_fault_hit() -> None:
    result = judged(faulted(fault_at=None))
    assert "fault" in seen(result.violations) and result.detection_latency_s is None


def fire_an_old_incarnation_left() -> None:
    run = faulted(old_alive=["pid 4242 of an old incarnation is alive"])
    assert seen(judged(run, leaks=("/dev/shm/faultlab_1_rpc was not unlinked",)).violations) \
        == ["leak", "leak"]


# -- the first recovery's latency, not the last's; the bound, not another ---------------------

def quiet_latency_of_the_first_recovery() -> None:  # 1.8 s: within 2.5 (the last's: 3.3)
    result = judged(faulted())
    assert result.detection_latency_s == pytest.approx(1.8) and result.violations == []


def quiet_a_recovery_with_no_new_token_passes_to_the_next() -> None:  # interrupted at once
    result = judged(faulted(records=[record(None, 1), record(5.9, 2)]))
    assert result.detection_latency_s == pytest.approx(1.9) and result.violations == []


def fire_latency_beyond_its_bound() -> None:  # 2.6 s > 2.5 s (well within node_timeout 10 s)
    [v] = judged(faulted(records=[record(6.6, 1), record(7.3, 2)])).violations
    assert v.invariant == "recovery_time" and "bound 2.5 s" in v.message


def quiet_latency_at_its_bound() -> None:
    assert judged(faulted(records=[record(6.5, 1)])).violations == []


def fire_recovered_with_no_new_token() -> None:  # recorded, finished, but no latency to judge
    [v] = judged(faulted(records=[record(None, 1)])).violations
    assert v.invariant == "recovery_time" and "took None s" in v.message


def quiet_latency_of_a_lone_recovery() -> None:
    assert rec.recovery_latency_s([record(5.0)], FAULT_AT) == pytest.approx(1.0)
    assert rec.recovery_latency_s([record(5.0)], None) is None
    assert rec.recovery_latency_s([], FAULT_AT) is None


# -- fail_stop: every request fails, naming the rank ------------------------------------------

FAILED_ALL = {"a": "engine failed", "b": "engine failed"}


def quiet_fail_stop_named_the_rank() -> None:
    run = faulted(scenario=FAIL_STOP, records=[], errors=FAILED_ALL,
                  engine_error="worker rank 1 (pid 4242) died")
    assert judged(run, FAIL_STOP).violations == []


def fire_fail_stop_did_not_name_the_rank() -> None:
    run = faulted(scenario=FAIL_STOP, records=[], errors=FAILED_ALL,
                  engine_error="worker (pid 4242) died")
    assert seen(judged(run, FAIL_STOP).violations) == ["fail_stop"]


def fire_fail_stop_nothing_failed() -> None:
    run = faulted(scenario=FAIL_STOP, records=[], engine_error="worker rank 1 (pid 4242) died")
    assert seen(judged(run, FAIL_STOP).violations) == ["fail_stop"]


# -- the skewed restart: kept tokens, and the count against the workers' own token log -------

PROMPTS = {"a": [1, 2, 3], "b": [4, 5]}
KEPT = {"a": [5, 6, 7], "b": [9]}
# (request, input position, token): a's rebuilt tokens 0..2 at positions 0, 3, 4 (token 1
# differs: 16 for 6); a's new token 3 at 5; b's rebuilt token 0 at 0 (same), new at 2.
LOG = [("a", 0, 5), ("b", 0, 9), ("a", 3, 16), ("b", 2, 30), ("a", 4, 7), ("a", 5, 40)]
FINAL = {"a": [5, 6, 7, 40], "b": [9, 30, 31, 32]}


def skewed(counted: int, outputs: dict[str, list[int]] | None = None,
           log: list[tuple[str, int, int]] | None = None) -> list[Violation]:
    with tempfile.TemporaryDirectory() as tmp:
        flag = Path(tmp) / "skew-flag"
        Path(str(flag) + ".jsonl").write_text(
            "".join(json.dumps(row) + "\n" for row in (LOG if log is None else log)))
        return skewed_restart.violations(flag, KEPT, PROMPTS, FINAL if outputs is None else outputs,
                                         SimpleNamespace(mismatches=counted))


def quiet_skew_counted_every_differing_rebuilt_token() -> None:
    assert skewed(counted=1) == []


def fire_skew_counted_none() -> None:
    [v] = skewed(counted=0)
    assert v.invariant == "mismatches" and v.message.startswith("1 rebuilt token(s) differed")


def fire_skew_counted_one_too_many() -> None:
    assert seen(skewed(counted=2)) == ["mismatches"]


def quiet_skew_new_tokens_are_not_rebuilt() -> None:  # new tokens of a differ from nothing kept
    log = [*LOG, ("a", 6, 41), ("b", 3, 31)]
    assert skewed(counted=1, log=log) == []


def fire_skew_changed_a_kept_token() -> None:
    outputs = {"a": [5, 16, 7, 40], "b": [9, 30, 31, 32]}
    [v] = skewed(counted=1, outputs=outputs)
    assert v.invariant == "tokens" and v.message.startswith("request a: a kept token changed")


def fire_skew_never_landed() -> None:
    assert seen(skewed(counted=0, log=[])) == ["fault"]


# -- the cases, and the plants they catch ------------------------------------------------------

CASES = [value for name, value in sorted(globals().items())
         if name.startswith(("fire_", "quiet_")) and callable(value)]


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_case(case: Any) -> None:
    case()


@pytest.mark.parametrize("judge", planted_in("recovery"), ids=lambda j: j.name)
def test_planted_judge_is_caught(judge: Any) -> None:
    assert_caught(judge, CASES)
