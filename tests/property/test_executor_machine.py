"""The executor state machine (chaos.machine) against the real executor, per start method."""

from __future__ import annotations

import pytest
from hypothesis.stateful import run_state_machine_as_test
from hypothesis_profiles import PROFILE, scaled

from chaos.machine import ExecutorMachine


class ForkMachine(ExecutorMachine):
    start_method = "fork"


class ForkserverMachine(ExecutorMachine):
    start_method = "forkserver"


class SpawnMachine(ExecutorMachine):
    start_method = "spawn"


def test_machine_fork() -> None:
    run_state_machine_as_test(ForkMachine, settings=PROFILE)


@pytest.mark.parametrize("machine", [ForkserverMachine, SpawnMachine], ids=["forkserver", "spawn"])
def test_machine_other_start_methods(machine: type[ExecutorMachine]) -> None:
    run_state_machine_as_test(machine, settings=scaled(0.1))
