"""The recovery scenario's token oracles can each fail on their own (chaos/recovery.py).

Three checks share the invariant name ``tokens``: the fault-free run in the scenario's layout
against TP=1's reference, each request's tokens against the reference, and the count of
rebuilt tokens that differed.  test_recovery_scenarios.py's tampered reference trips the
first; here a judged run breaks one check at a time, at the same length (one token changed):

    what differs                                     violation
    nothing                                          none
    one token of one request's output                "request b: tokens differ"
    the recovery counted 2 differing rebuilt tokens  "2 rebuilt token(s) differed"
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from chaos.oracles import Violation
from chaos.recovery import RecoveryScenario, _oracles

REFERENCE = {"a": [5, 6, 7, 8], "b": [9, 10, 11, 12]}


def _judged(outputs: dict[str, list[int]], mismatches: int = 0) -> list[Violation]:
    """The oracles of a recovered run (restart policy) that produced ``outputs``."""
    scenario = RecoveryScenario(name="judged", max_tokens=4, steps=(1, 2))
    run: Any = SimpleNamespace(baseline=REFERENCE, fault_at=1.0, errors={}, engine_error="",
                               outputs=outputs, old_alive=[], second=None)
    result: Any = SimpleNamespace(recovered=True, detection_latency_s=0.5)
    recovery = SimpleNamespace(mismatches=mismatches)
    return _oracles(scenario, run, REFERENCE, [], result, recovery)


def test_a_run_with_the_reference_tokens_passes() -> None:
    assert _judged({rid: list(t) for rid, t in REFERENCE.items()}) == []


def test_one_changed_token_of_one_request_is_reported() -> None:
    outputs = {"a": [5, 6, 7, 8], "b": [9, 10, 99, 12]}  # same length, one token differs
    [violation] = _judged(outputs)
    assert violation.invariant == "tokens"
    assert violation.message == "request b: tokens differ from the fault-free run's"


def test_differing_rebuilt_tokens_are_reported_even_when_the_outputs_match() -> None:
    [violation] = _judged({rid: list(t) for rid, t in REFERENCE.items()}, mismatches=2)
    assert (violation.invariant, violation.message) == ("tokens", "2 rebuilt token(s) differed")
