"""chaos.strategies: valid, replayable draws, and chaos's random source under Hypothesis."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis_profiles import scaled

from chaos import FaultPlan, schedule_signature
from chaos.faults import SIGNAL
from chaos.strategies import (
    RPC_METHODS,
    SHARED_RANDOM,
    call_sequences,
    rpc_calls,
    signal_fault_plans,
    unique_args,
)
from chaos.workloads import CallSpec


@scaled(1.0, minimum=50)
@given(call_sequences(2, max_calls=8))
def test_call_sequences_are_valid_with_unique_results(calls: list[CallSpec]) -> None:
    assert 1 <= len(calls) <= 8
    for spec in calls:
        assert spec.method in RPC_METHODS
        assert spec.timeout is None or spec.timeout > 0
        assert spec.unique_reply_rank in (None, 0, 1)
        assert CallSpec.from_dict(spec.to_dict(), "call") == spec
    payloads = [unique_args(spec, i) for i, spec in enumerate(calls) if spec.method != "get_rank"]
    assert len(set(payloads)) == len(payloads), "two calls would expect the same result"


@scaled(1.0, minimum=20)
@given(rpc_calls(non_block=True), rpc_calls(non_block=False, timeouts=(None,)))
def test_rpc_calls_honour_fixed_fields(a: CallSpec, b: CallSpec) -> None:
    assert a.non_block and not b.non_block and b.timeout is None


@scaled(1.0, minimum=50)
@given(signal_fault_plans(2, max_faults=3))
def test_signal_fault_plans_replay_from_their_seed(plan: FaultPlan) -> None:
    assert all(f.phase == SIGNAL and f.rank in (0, 1) for f in plan.faults)
    assert schedule_signature(plan.resolve()) == schedule_signature(plan.resolve())
    assert FaultPlan.from_dict(plan.to_dict()) == plan


def test_shared_random_is_reset_for_every_example() -> None:
    """Registered with Hypothesis: each example starts it from the same state (replayable)."""
    seen: list[float] = []

    @settings(max_examples=10, database=None, derandomize=True)
    @given(st.integers())
    def draw(_: int) -> None:
        seen.append(SHARED_RANDOM.random())

    draw()
    assert len(seen) >= 2 and len(set(seen)) == 1, seen
