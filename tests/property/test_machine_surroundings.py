"""The state machine with the rules for what surrounds the executor (chaos.machine_rules),
against the real executor, and against two executors that only these rules can catch:

    executor        broken promise                                  the rule that sees it
    SkipsChecksum   a damaged payload is caught by its checksum     damage_next_request
    NoSigkill       shutdown escalates to SIGKILL                   stubborn_worker + shutdown

Shrinking is capped (conftest.py ``bounded_shrinking``), so a failure prints its shrunk
steps well within the per-test timeout.
"""

from __future__ import annotations

import re
import time

import pytest
from hypothesis import Phase, settings
from hypothesis.errors import Flaky
from hypothesis.stateful import run_state_machine_as_test
from hypothesis_profiles import PROFILE, scaled

from chaos.machine_rules import InterruptPointsMachine, SurroundingsMachine
from chaos.mutants import LocksBeforeTry, NoSigkill, SkipsChecksum
from executor import MultiprocExecutor

# A SIGINT that lands while the interpreter runs a finalizer or weakref callback is printed
# and dropped by CPython ("Exception ignored in ..."): that Ctrl-C never reaches anyone, which
# is the interpreter's behaviour, not the executor's.  The Ctrl-C rule then sees a call that
# simply returned; pytest would otherwise turn the printed exception into an error.
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


class ForkSurroundings(InterruptPointsMachine):
    start_method = "fork"


def test_surroundings_machine_fork() -> None:
    run_state_machine_as_test(ForkSurroundings, settings=scaled(0.3))


HUNT = settings(PROFILE, max_examples=200, stateful_step_count=8, derandomize=True, database=None,
                phases=[Phase.generate, Phase.shrink], report_multiple_bugs=False)


def _machine(executor_class: type[MultiprocExecutor]) -> type[SurroundingsMachine]:
    attrs = {"executor_class": executor_class, "slack_s": 0.5, "detect_s": 0.5, "__module__": __name__}
    return type(f"SurroundingsOn{executor_class.__name__}", (SurroundingsMachine,), attrs)


SurroundingsOnSkipsChecksum = _machine(SkipsChecksum)
SurroundingsOnNoSigkill = _machine(NoSigkill)
SurroundingsOnLocksBeforeTry = type("SurroundingsOnLocksBeforeTry", (InterruptPointsMachine,), {
    "executor_class": LocksBeforeTry, "slack_s": 0.5, "detect_s": 0.5, "__module__": __name__})


@pytest.mark.parametrize(("machine", "symptom"), [
    (SurroundingsOnSkipsChecksum, "not a checksum error"),
    (SurroundingsOnNoSigkill, r"are alive|shutdown\(\) (had not returned|in teardown did not return)"),
], ids=["SkipsChecksum", "NoSigkill"])
def test_surroundings_rules_find_the_bug(machine: type[SurroundingsMachine], symptom: str) -> None:
    t0 = time.monotonic()
    with pytest.raises((AssertionError, Flaky)) as info:
        run_state_machine_as_test(machine, settings=HUNT)
    notes = "\n".join(getattr(info.value, "__notes__", []))
    print(f"\n--- {machine.__name__}: found and shrunk in {time.monotonic() - t0:.1f} s ---")
    print(notes)
    assert f"state = {machine.__name__}()" in notes, "no shrunk step list was printed"
    # A timing-dependent bug may be reported as Flaky: its first failure is a sub-exception.
    text = "\n".join([str(info.value), *map(str, getattr(info.value, "exceptions", ()))])
    assert re.search(symptom, text), f"found another bug first: {text}"


@pytest.mark.parametrize(("machine", "escalates"), [(ForkSurroundings, True),
                                                   (SurroundingsOnNoSigkill, False)],
                         ids=["real", "NoSigkill"])
def test_a_stubborn_worker_needs_sigkill(machine: type[SurroundingsMachine], escalates: bool) -> None:
    """The steps the hunt shrinks to, written out: a stubborn worker, then shutdown()."""
    state = machine()
    try:
        state.stubborn_worker(rank=0)
        time.sleep(0.2)  # the worker is inside the method, SIGTERM ignored
        if escalates:
            state.shutdown()
        else:
            with pytest.raises(AssertionError, match=r"are alive|a hang"):
                state.shutdown()
    finally:
        state.teardown()


def test_interrupt_points_rule_finds_a_lock_taken_before_its_try() -> None:
    """chaos.mutants.LocksBeforeTry (the round-3 Ctrl-C wedge): the interrupt_at_points rule,
    stepped through its windows as a hunt would, names the lock left held.  Written out, not
    hunted: which points a call passes varies from run to run, which Hypothesis reports as
    inconsistent data generation rather than the bug."""
    state = SurroundingsOnLocksBeforeTry()
    try:
        with pytest.raises(AssertionError, match=r"left lock\(s\) \['reply_lock'\] held"):
            for window in range(64):
                state.interrupt_at_points(window=window)
    finally:
        state.teardown()
