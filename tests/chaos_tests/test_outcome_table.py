"""The expected-outcome table (chaos.outcomes.TABLE), run on fork, forkserver and spawn.

Each row: a fault, where it hits, and what the executor must do.  The scenario shows the
fault's effect (the fault timeline records it, the observed outcome matches) and the
executor's own check catching it (ExecutorFailedError, TimeoutError, WorkerError, ...).
"""

from __future__ import annotations

import pytest
from helpers import real_violations

from chaos import TABLE, FaultPlan, Outcome, run_scenario
from chaos.outcomes import config_for
from chaos.workloads import standard
from executor import ExecutorConfig

START_METHODS = ("fork", "forkserver", "spawn")
# On forkserver and spawn, one row per outcome class keeps the suite within its time budget.
_REPRESENTATIVE = {"kill, before reply", "sigterm, external", "block before execute",
                   "raise before execute", "flip reply payload", "clobber rpc seq",
                   "kill the driver mid-call", "slow every call"}
CASES = [pytest.param(sm, fault, outcome, id=f"{sm}-{name}")
         for sm in START_METHODS for name, fault, outcome in TABLE
         if sm == "fork" or name in _REPRESENTATIVE]


@pytest.mark.parametrize(("start_method", "fault", "expected"), CASES)
def test_outcome_table(start_method, fault, expected, tmp_path):
    cfg = ExecutorConfig(tensor_parallel_size=2, start_method=start_method, **config_for(fault))
    result = run_scenario(cfg, standard, FaultPlan([fault], seed=5), tmp_path, expected=expected)
    assert result.faults, f"{fault} never fired"
    assert result.faults[0]["kind"] == fault.kind
    assert result.outcome == expected
    assert real_violations(result) == []
    if expected == Outcome.FAIL_FAST:
        assert result.detection_latency_s is not None and result.detection_latency_s < 3.0
        errors = {c.error_type for c in result.calls}
        assert "ExecutorFailedError" in errors
    if not fault.external and fault.kind != "kill_driver":
        assert result.fired_points, "an internal fault must report the failpoint it used"


def test_every_fault_kind_is_in_the_table():
    from chaos.faults import KINDS

    assert {f.kind for _, f, _ in TABLE} == set(KINDS)
