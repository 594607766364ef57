"""Recovery scenarios (chaos.recovery): generation under a fault, judged by the oracles.

    scenario                      expected
    kill rank 1, restart          recovered, fault-free tokens, nothing of the old incarnation left
    corrupt the rpc queue         recovered
    kill, fail_stop               every request fails naming the rank
    tampered reference            the tokens oracle reports it (the oracle can fail)
    bad [[recovery]] table        SuiteError naming the key
"""

from __future__ import annotations

from pathlib import Path

import pytest

from chaos.recovery import RecoveryScenario, _judge, reference_tokens, run_recovery
from chaos.suites import SuiteError, load_suite

SMALL = {"max_tokens": 10, "steps": (2, 5), "requests": 3}


@pytest.mark.parametrize("fault", ["kill", "corrupt"])
def test_restart_recovers_with_fault_free_tokens(tmp_path: Path, fault: str) -> None:
    result = run_recovery(RecoveryScenario(name=fault, fault=fault, **SMALL), 1, tmp_path)  # type: ignore[arg-type]
    assert result.ok, result.violations
    assert result.recovered and result.requests_lost == 0 and result.tokens_recomputed > 0
    assert (tmp_path / "result.json").exists()


def test_fail_stop_loses_every_request(tmp_path: Path) -> None:
    scenario = RecoveryScenario(name="fs", policy="fail_stop", **SMALL)  # type: ignore[arg-type]
    result = run_recovery(scenario, 1, tmp_path)
    assert result.ok and not result.recovered and result.requests_lost == 3


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
    assert {r.fault for r in suite.recovery} == {"kill", "sigterm", "hang", "corrupt"}
    assert len(load_suite("smoke").recovery) == 1
    seeds = {RecoveryScenario(name="a").fault_step(s) for s in range(20)}
    assert len(seeds) > 1 and RecoveryScenario(name="a").fault_step(7) == \
        RecoveryScenario(name="a").fault_step(7)
