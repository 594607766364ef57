"""Recovery scenarios (chaos.recovery): generation under a fault, judged by the oracles.

    scenario                      expected
    kill rank 1, restart          recovered, fault-free tokens, nothing of the old incarnation left
    corrupt the rpc queue         recovered
    2 nodes: kill node 1's worker recovered (node 1's agent starts the new incarnation),
                                  fault-free tokens, nothing old left on either node
    2 nodes: kill node 1's agent  a fresh agent rejoins; recovered, fault-free tokens
      and worker (kill_node)
    kill, fail_stop               every request fails naming the rank; no during/after rate
    any run                       tokens/s: baseline (fault-free, same executor), during, after
    tampered reference            the tokens oracle reports it (the oracle can fail)
    bad [[recovery]] table        SuiteError naming the key
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chaos.faults import PlanError
from chaos.recovery import RecoveryResult, RecoveryScenario, _judge, reference_tokens, run_recovery
from chaos.suites import SuiteError, load_suite

SMALL = {"max_tokens": 10, "steps": (2, 5), "requests": 3}


@pytest.mark.parametrize("fault", ["kill", "corrupt"])
def test_restart_recovers_with_fault_free_tokens(tmp_path: Path, fault: str) -> None:
    result = run_recovery(RecoveryScenario(name=fault, fault=fault, **SMALL), 1, tmp_path)  # type: ignore[arg-type]
    assert result.ok, result.violations
    assert result.recovered and result.requests_lost == 0 and result.tokens_recomputed > 0
    assert (tmp_path / "result.json").exists()
    _assert_rates(result)


def _assert_rates(result: RecoveryResult) -> None:
    """Every rate is there and positive: the step bringing the first new token counts as during."""
    assert result.baseline_tokens_per_s is not None and result.baseline_tokens_per_s > 0
    assert result.after_tokens_per_s is not None and result.after_tokens_per_s > 0
    assert result.during_tokens_per_s is not None and result.during_tokens_per_s > 0
    saved = json.loads((result.out_dir / "result.json").read_text())
    assert saved["after_tokens_per_s"] == result.after_tokens_per_s


@pytest.mark.parametrize("fault", ["kill", "kill_node"], ids=["node-worker", "node-agent"])
def test_node_loss_recovers_with_fault_free_tokens(tmp_path: Path, fault: str) -> None:
    scenario = RecoveryScenario(name=f"node-{fault}", fault=fault, rank=1, nnodes=2,
                                recovery_bound_s=60.0, **SMALL)  # type: ignore[arg-type]
    result = run_recovery(scenario, 1, tmp_path)
    assert result.ok, result.violations
    assert result.recovered and result.requests_lost == 0 and result.tokens_recomputed > 0
    _assert_rates(result)


def test_kill_node_needs_a_remote_rank() -> None:
    with pytest.raises(PlanError, match="kill_node needs nnodes > 1"):
        RecoveryScenario.from_dict({"name": "x", "fault": "kill_node"}, "r")
    with pytest.raises(PlanError, match="kill_node needs nnodes > 1"):
        RecoveryScenario.from_dict({"name": "x", "fault": "kill_node", "nnodes": 2, "rank": 0}, "r")
    with pytest.raises(PlanError, match=r"r\.nnodes: must divide"):
        RecoveryScenario.from_dict({"name": "x", "nnodes": 3}, "r")


def test_fail_stop_loses_every_request(tmp_path: Path) -> None:
    scenario = RecoveryScenario(name="fs", policy="fail_stop", **SMALL)  # type: ignore[arg-type]
    result = run_recovery(scenario, 1, tmp_path)
    assert result.ok and not result.recovered and result.requests_lost == 3
    assert result.baseline_tokens_per_s and result.after_tokens_per_s is None


def test_tokens_oracle_catches_a_difference(tmp_path: Path) -> None:
    from chaos.recovery import _FaultedRun

    scenario = RecoveryScenario(name="k", **SMALL)  # type: ignore[arg-type]
    reference = reference_tokens(scenario, 1)
    run = _FaultedRun(scenario, 1)
    run.execute(tmp_path / "nodes")
    wrong = {rid: [t + 1 for t in tokens] for rid, tokens in reference.items()}
    result = _judge(scenario, 1, tmp_path, run, wrong, [], 0.0)
    assert any(v.invariant == "tokens" for v in result.violations)


def test_bad_recovery_table_names_the_key(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('[[recovery]]\nname = "x"\nfault = "explode"\n')
    with pytest.raises(SuiteError, match=r"recovery\[0\].fault"):
        load_suite(str(path))
    path.write_text('[[recovery]]\nname = "x"\nrank = 5\n')
    with pytest.raises(SuiteError, match=r"recovery\[0\].rank"):
        load_suite(str(path))


def test_recovery_suite_and_smoke_row_load() -> None:
    suite = load_suite("recovery")
    assert {r.fault for r in suite.recovery} == {"kill", "sigterm", "hang", "corrupt",
                                                 "kill_node"}
    assert any(r.nnodes == 2 for r in suite.recovery)
    assert len(load_suite("smoke").recovery) == 1
    seeds = {RecoveryScenario(name="a").fault_step(s) for s in range(20)}
    assert len(seeds) > 1 and RecoveryScenario(name="a").fault_step(7) == \
        RecoveryScenario(name="a").fault_step(7)
