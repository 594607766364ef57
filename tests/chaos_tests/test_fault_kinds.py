"""What a fault kind means lives on its class (chaos.faults): the injector, the trace, the
strategies, the oracles and the outcome table read it there.  An unknown kind, or one the
chaos side has no way to deliver, raises; it never silently does nothing."""

from __future__ import annotations

import dataclasses
import types
from typing import ClassVar

import pytest

from chaos import edge_oracles
from chaos.faults import KINDS, Fault, PlanError, fault_class, fault_from_dict, kinds_where, signal_name
from chaos.injector import Injector
from chaos.outcomes import Outcome, outcome_for
from chaos.strategies import SIGNAL_KINDS

TARGETS = {"worker", "driver", "node", "queue", "around"}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_kind_says_what_it_means(kind: str) -> None:
    cls = fault_class(kind)
    assert cls.kind == kind and cls.target in TARGETS
    assert Outcome(cls.expected) in Outcome
    if cls.signal is not None:
        assert (signal_name(kind) or "").startswith("SIG")


def test_the_sets_the_checks_use_come_from_the_kinds() -> None:
    assert frozenset(kinds_where(stops_readers=True)) == edge_oracles._STOP_READERS
    assert "kill_worker" in edge_oracles._FATAL_KINDS and "hang_worker" not in edge_oracles._FATAL_KINDS
    assert SIGNAL_KINDS == ("kill_worker", "term_worker", "hang_worker")  # SIGCONT undoes, not breaks
    assert outcome_for(fault_class("kill_driver")()) == Outcome.EXIT_CLEAN


def test_an_unknown_kind_is_refused() -> None:
    with pytest.raises(PlanError, match="unknown fault kind 'melt_cpu'"):
        fault_class("melt_cpu")
    with pytest.raises(PlanError, match="kind: must be one of"):
        fault_from_dict({"kind": "melt_cpu"})


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Undeliverable(Fault):
    kind: ClassVar[str] = "undeliverable"
    target: ClassVar[str] = "around"


def test_a_kind_the_injector_cannot_deliver_raises() -> None:
    """The injector's dispatch has an else: a new kind without a delivery path fails loudly."""
    fired = types.SimpleNamespace(fault=_Undeliverable(), index=0)
    with pytest.raises(PlanError, match="undeliverable: the chaos side has no way to deliver it"):
        Injector._act(None, fired, None)  # type: ignore[arg-type]
