"""The state machine is worth something only if it fails on broken executors: it must.

Each executor below breaks one promise of docs/design.md, section 1.2.  Hypothesis must find a
failing step sequence, shrink it, and print it with a ``@reproduce_failure`` blob; the
shrunk steps are written to the test's output (run with ``-s`` to see them).

    executor             broken promise                               how the machine sees it
    IgnoresRequestIds    stale replies are dropped by request id      a call gets another's value
    DropsDeadline        TimeoutError at the deadline                 a call hangs past its bound
    SwallowsDeath        worker death fails in-flight calls           kill: futures never resolve
    DrainsTargetFirst    result() drains earlier calls first          earlier calls lose replies

They reach into executor internals on purpose (a broken executor is a patched one).
Under the ci profile shrinking is capped at ``SHRINK_S`` seconds per bug (each failing
candidate costs a bound of real time); the nightly profile shrinks fully.
"""

from __future__ import annotations

import time

import pytest
from hypothesis import Phase, settings
from hypothesis.errors import Flaky
from hypothesis.internal.conjecture import engine
from hypothesis.stateful import run_state_machine_as_test
from hypothesis_profiles import PROFILE, PROFILE_NAME

from chaos.machine import ExecutorMachine
from chaos.mutants import DrainsTargetFirst, DropsDeadline, IgnoresRequestIds, SwallowsDeath
from chaos.strategies import call_spec
from executor import MultiprocExecutor

BROKEN = [IgnoresRequestIds, DropsDeadline, SwallowsDeath, DrainsTargetFirst]

# Small and deterministic: enough examples to find each bug, short runs to shrink fast.
HUNT = settings(PROFILE, max_examples=200, stateful_step_count=8, derandomize=True, database=None,
                phases=[Phase.generate, Phase.shrink], report_multiple_bugs=False)


SHRINK_S = 12


@pytest.fixture
def bounded_shrinking(monkeypatch: pytest.MonkeyPatch) -> None:
    """Cap Hypothesis' shrinking time (an internal knob, default 300 s) under ci."""
    if PROFILE_NAME == "ci" and hasattr(engine, "MAX_SHRINKING_SECONDS"):
        monkeypatch.setattr(engine, "MAX_SHRINKING_SECONDS", SHRINK_S)


def machine_for(executor_class: type[MultiprocExecutor]) -> type[ExecutorMachine]:
    # Tighter bounds than the real tests: the broken behaviours are off by seconds or forever.
    attrs = {"executor_class": executor_class, "slack_s": 0.5, "detect_s": 0.5, "__module__": __name__}
    return type(f"MachineOn{executor_class.__name__}", (ExecutorMachine,), attrs)


# Module-level names, so that a printed step list runs as written (see the replay test).
MachineOnIgnoresRequestIds = machine_for(IgnoresRequestIds)
MachineOnDropsDeadline = machine_for(DropsDeadline)
MachineOnSwallowsDeath = machine_for(SwallowsDeath)
MachineOnDrainsTargetFirst = machine_for(DrainsTargetFirst)
MACHINES = [MachineOnIgnoresRequestIds, MachineOnDropsDeadline, MachineOnSwallowsDeath,
            MachineOnDrainsTargetFirst]


@pytest.mark.parametrize("machine", MACHINES, ids=[b.__name__ for b in BROKEN])
@pytest.mark.usefixtures("bounded_shrinking")
def test_machine_finds_the_bug(machine: type[ExecutorMachine]) -> None:
    broken = machine.executor_class
    t0 = time.monotonic()
    with pytest.raises((AssertionError, Flaky)) as info:
        run_state_machine_as_test(machine, settings=HUNT)
    notes = "\n".join(getattr(info.value, "__notes__", []))
    print(f"\n--- {broken.__name__}: found and shrunk in {time.monotonic() - t0:.1f} s ---")
    print(f"{type(info.value).__name__}: {str(info.value).splitlines()[0]}")
    print(notes)
    assert f"state = {machine.__name__}()" in notes, "no shrunk step list was printed"
    assert "@reproduce_failure(" in notes, "no reproduction blob was printed"


def test_a_printed_step_list_replays() -> None:
    """The shrunk steps Hypothesis printed for DropsDeadline, pasted in: they fail the same way.
    (Or decorate the machine class with the printed ``@reproduce_failure(...)``.)"""
    state = MachineOnDropsDeadline()
    try:
        state.stop(rank=0)
        with pytest.raises(AssertionError, match="had not returned by its bound"):
            state.call(spec=call_spec("echo", 0.0, 0.05, False, None))
    finally:
        state.teardown()
