"""The outside_reaper surrounding (issue 25, defect 4): someone else reaps the driver's
children — SIGCHLD set to SIG_IGN, or a handler collecting any child with waitpid(-1) —
from the fault until after shutdown().

    fault                      where it hits                 expected
    outside_reaper (either)    alone, steady calls           recover; shutdown fast; nothing left
    outside_reaper + kill      rank 1 mid-call               fail fast, the death named (rank, pid)
    either, TrustsWaitpid      liveness and signals by pid   shutdown, leak, late callback,
                                                             "still running" (death) violations
"""

from __future__ import annotations

import signal

import pytest
from helpers import real_violations

from chaos import Bounds, FaultPlan, KillWorker, run_scenario
from chaos import mutants as broken
from chaos.faults import REAPER_MODES, OutsideReaper, PlanError
from chaos.outcomes import Outcome
from chaos.workload_names import BUILTIN
from chaos.workloads import standard
from executor import ExecutorConfig

HIT = ("sleep", 1)
TIGHT = Bounds(shutdown_slack_s=1.0)  # grace 2 s + SIGTERM 1 s + 1 s: the old shutdown took 8 s


def _cfg(start_method: str = "fork") -> ExecutorConfig:
    return ExecutorConfig(tensor_parallel_size=2, start_method=start_method)


@pytest.fixture(autouse=True)
def sigchld_restored():
    before = signal.getsignal(signal.SIGCHLD)
    yield
    assert signal.getsignal(signal.SIGCHLD) == before
    signal.signal(signal.SIGCHLD, before)


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
@pytest.mark.parametrize("mode", REAPER_MODES)
def test_an_outside_reaper_changes_nothing_for_calls(tmp_path, mode, start_method):
    plan = FaultPlan([OutsideReaper(at=0.0, mode=mode)], seed=4)
    result = run_scenario(_cfg(start_method), BUILTIN["steady"], plan, tmp_path, bounds=TIGHT)
    assert [f["kind"] for f in result.faults] == ["outside_reaper"]
    assert real_violations(result) == []
    assert result.outcome == Outcome.RECOVER
    assert result.shutdown_s is not None and result.shutdown_s < 1.5


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
@pytest.mark.parametrize("mode", REAPER_MODES)
def test_a_death_under_an_outside_reaper_is_named(tmp_path, mode, start_method):
    plan = FaultPlan([OutsideReaper(at=0.0, mode=mode), KillWorker(rank=1, on_call=HIT)], seed=4)
    result = run_scenario(_cfg(start_method), standard, plan, tmp_path, bounds=TIGHT)
    assert real_violations(result) == []
    assert result.outcome == Outcome.FAIL_FAST
    assert result.shutdown_s is not None and result.shutdown_s < 1.5


# "reap" races a reaper thread that polls every 2 ms against the mutant's own waitpid: when
# the mutant reaps first it behaves like a correct executor and there is nothing to catch
# (seen in 2 of 3 runs on a loaded machine).  "ignore" (the kernel reaps) is deterministic.
_RACY_REAP = pytest.mark.xfail(strict=False, reason="the mutant's own waitpid may win the race "
                               "against the 2 ms reaper thread: then nothing was reaped elsewhere")
MUTANT_MODES = [pytest.param(m, marks=_RACY_REAP) if m == "reap" else m for m in REAPER_MODES]


@pytest.mark.parametrize("mode", MUTANT_MODES)
def test_the_outside_reaper_catches_an_executor_that_trusts_waitpid(tmp_path, mode):
    """Alone: shutdown waits out every grace for workers already reaped, and leaks their fds."""
    plan = FaultPlan([OutsideReaper(at=0.0, mode=mode)], seed=4)
    result = run_scenario(_cfg(), BUILTIN["steady"], plan, tmp_path, bounds=TIGHT,
                          executor_class=broken.TrustsWaitpid)
    found = {v.invariant for v in result.violations}
    assert {"shutdown", "leak"} <= found, result.violations


@pytest.mark.parametrize("mode", MUTANT_MODES)
def test_the_outside_reaper_catches_a_death_the_broken_executor_misreports(tmp_path, mode):
    """With a death: reported late (the failure path's shutdown waits out every grace
    before the callbacks run), its fds leaked, and, when the kernel reaped it, "still running"."""
    plan = FaultPlan([OutsideReaper(at=0.0, mode=mode), KillWorker(rank=1, on_call=HIT)], seed=4)
    result = run_scenario(_cfg(), standard, plan, tmp_path, bounds=TIGHT,
                          executor_class=broken.TrustsWaitpid)
    found = {v.invariant for v in result.violations}
    assert "leak" in found and found & {"callback", "shutdown"}, result.violations
    if mode == "ignore":  # a reaping handler may beat the monitor's waitpid, or not
        assert "death" in found, result.violations


def test_without_an_outside_reaper_the_broken_executor_passes(tmp_path):
    """The mutant is exactly the defect: the same run without the reaper is clean."""
    plan = FaultPlan([KillWorker(rank=1, on_call=HIT)], seed=4)
    result = run_scenario(_cfg(), standard, plan, tmp_path, bounds=TIGHT,
                          executor_class=broken.TrustsWaitpid)
    assert real_violations(result) == []


def test_an_outside_reaper_checks_its_mode():
    with pytest.raises(PlanError, match="mode must be one of"):
        OutsideReaper(mode="sometimes")
