"""A recovery scenario's ``executor`` and ``recovery`` ("module:Class") name classes of their
kind: the default when empty, the named class, else a PlanError that names the key."""

from __future__ import annotations

import pytest

from chaos.faults import PlanError
from chaos.mutants import KeepsRebuiltToken, SwallowsDeath
from chaos.recovery import RecoveryScenario
from executor import MultiprocExecutor


def test_executor_and_recovery_resolve_to_classes_of_their_kind() -> None:
    plain = RecoveryScenario("plain")
    assert plain.executor_class() is MultiprocExecutor and plain.recovery_class() is None
    named = RecoveryScenario("named", executor="chaos.mutants:SwallowsDeath",
                             recovery="chaos.mutants:KeepsRebuiltToken")
    assert named.executor_class() is SwallowsDeath
    assert named.recovery_class() is KeepsRebuiltToken


def test_a_class_of_the_other_kind_is_a_plan_error() -> None:
    swapped = RecoveryScenario("swapped", executor="chaos.mutants:KeepsRebuiltToken",
                               recovery="chaos.mutants:SwallowsDeath")
    with pytest.raises(PlanError, match=r"executor 'chaos.mutants:KeepsRebuiltToken' is not a "
                                        r"MultiprocExecutor class"):
        swapped.executor_class()
    with pytest.raises(PlanError, match=r"recovery 'chaos.mutants:SwallowsDeath' is not a "
                                        r"Recovery class"):
        swapped.recovery_class()
