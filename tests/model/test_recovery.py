"""Recovery under the ``restart`` policy: the workers restart, every request finishes, and
its tokens are exactly the fault-free run's.

    fault                  where                          expected outcome
    SIGKILL                a rank at step 6 (4 layouts)   same tokens, 1 recovery, 0 lost
    SIGSTOP (hang)         a rank; step timeout 1 s        same tokens, 1 recovery
    SIGKILL twice          request_retries=1              every unfinished request lost, named
    SIGKILL                restart_budget=0               engine fails: "recovery failed"
    SIGKILL, new workers   rebuilt tokens all differ      each counted as a mismatch, none
      resample otherwise                                  used: the kept tokens stay
                                                          (CountsNoMismatch, KeepsRebuiltToken
                                                          of chaos/mutants.py are caught)
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
from model_helpers import PROMPTS, model_config
from recovery_helpers import kept_tokens

from chaos import mutants
from executor import MultiprocExecutor
from executor.model.engine import EngineFailedError, LLMEngine, Request, RequestFailedError
from executor.model.recovery import RESTART, Recovery, Restart, policy_named

TOKENS = 24
FAULT_STEP = 6


@pytest.fixture(scope="module")
def reference() -> dict[str, list[int]]:
    """The fault-free tokens (the same for every layout: the model is layout-exact)."""
    with MultiprocExecutor(model_config()) as ex:
        return LLMEngine(ex, step_timeout=30).generate(PROMPTS, TOKENS)


def _run(engine: LLMEngine, faults: dict[int, Callable[[], None]]) -> dict[str, list[int]]:
    """Step to the end, calling ``faults[n]`` once the engine has completed n steps."""
    for rid, prompt in PROMPTS.items():
        engine.add_request(rid, prompt, TOKENS)
    outputs, done = {}, set()
    while engine.has_unfinished():
        for request in engine.step():
            outputs[request.request_id] = list(request.output_token_ids)
        step = engine.stats.steps
        if step in faults and step not in done:
            done.add(step)
            faults[step]()
    return outputs


def _kill(ex: MultiprocExecutor, rank: int, sig: int = signal.SIGKILL) -> Callable[[], None]:
    return lambda: os.kill(ex.worker_pids[rank], sig)


@pytest.mark.parametrize("tp, pp, rank, async_scheduling", [
    pytest.param(1, 1, 0, False, id="tp1"),
    pytest.param(2, 1, 1, False, id="tp2-peer-rank"),
    pytest.param(1, 2, 0, False, id="pp2-first-stage"),
    pytest.param(1, 1, 0, True, id="tp1-async"),
])
def test_killed_rank_recovers_with_fault_free_tokens(
        reference: dict[str, list[int]], tp: int, pp: int, rank: int,
        async_scheduling: bool) -> None:
    with MultiprocExecutor(model_config(tp, pp, async_scheduling=async_scheduling)) as ex:
        engine = LLMEngine(ex, step_timeout=30, recovery=RESTART)
        old = list(ex.worker_pids)
        outputs = _run(engine, {FAULT_STEP: _kill(ex, rank)})
        assert ex.incarnation == 1 and not set(old) & set(ex.worker_pids)
    assert outputs == reference
    recovery = engine.recovery
    assert recovery is not None and recovery.mismatches == 0 and not recovery.lost
    [record] = recovery.records
    assert f"worker rank {rank}" in record.cause and "SIGKILL" in record.cause
    assert record.requests_rebuilt == len(PROMPTS) and record.tokens_recomputed > 0
    assert record.first_token_at is not None


def test_hung_rank_is_restarted_after_the_step_timeout(reference: dict[str, list[int]]) -> None:
    with MultiprocExecutor(model_config(2, 1)) as ex:
        engine = LLMEngine(ex, step_timeout=1.0, recovery=RESTART)
        outputs = _run(engine, {FAULT_STEP: _kill(ex, 1, signal.SIGSTOP)})
    assert outputs == reference
    assert engine.recovery is not None
    [record] = engine.recovery.records
    assert "step timeout" in record.cause and "rank 1" in record.cause


def test_request_lost_when_its_retry_budget_is_spent() -> None:
    policy = Restart(request_retries=1)
    with MultiprocExecutor(model_config()) as ex:
        engine = LLMEngine(ex, step_timeout=30, recovery=policy)
        futures = [engine.add_request(rid, p, TOKENS) for rid, p in PROMPTS.items()]
        faults = {FAULT_STEP: _kill(ex, 0), FAULT_STEP + 2: _kill(ex, 0)}
        done: set[int] = set()
        while engine.has_unfinished():
            engine.step()
            if engine.stats.steps in faults and engine.stats.steps not in done:
                done.add(engine.stats.steps)
                faults[engine.stats.steps]()
        assert ex.incarnation == 2 and engine.failure is None
    for future in futures:
        error = future.exception(timeout=0)
        assert isinstance(error, RequestFailedError)
        assert "retry budget of 1 recoveries is spent" in str(error)
        assert "worker rank 0" in str(error) and "SIGKILL" in str(error)


def test_engine_fails_when_the_executor_restart_budget_is_spent() -> None:
    with MultiprocExecutor(model_config(restart_budget=0)) as ex:
        engine = LLMEngine(ex, step_timeout=30, recovery=RESTART)
        with pytest.raises(EngineFailedError, match="recovery failed: restart budget spent"):
            _run(engine, {FAULT_STEP: _kill(ex, 0)})
    with pytest.raises(EngineFailedError, match="worker rank 0"):
        engine.step()


def test_generate_names_the_lost_requests() -> None:
    policy = Restart(request_retries=0)
    with MultiprocExecutor(model_config()) as ex:
        engine = LLMEngine(ex, step_timeout=30, recovery=policy)
        os.kill(ex.worker_pids[0], signal.SIGKILL)
        with pytest.raises(EngineFailedError, match=f"{len(PROMPTS)} of {len(PROMPTS)} "
                                                    "requests lost"):
            engine.generate(PROMPTS, TOKENS)


def test_bad_policies_are_refused() -> None:
    with pytest.raises(ValueError, match="recovery policy"):
        policy_named("retry_forever")
    with pytest.raises(ValueError, match="request_retries"):
        Restart(request_retries=-1)
    with pytest.raises(TypeError, match="needs an executor with restart"):
        LLMEngine(_NoRestart(), recovery=RESTART)  # type: ignore[arg-type]


class _NoRestart:
    output_rank = 0
    max_concurrent_batches = 1


# ---------------------------------------------------------------- a rebuilt token that differs

def check_replayed_counts_and_keeps(recovery_class: type[Recovery]) -> None:
    """One request with 3 kept tokens, replayed: the middle one comes back different."""
    recovery = recovery_class(RESTART)
    request = Request("r", (1, 2), 5, output_token_ids=[7, 8, 9], replay=0)
    for token, replay_after in ((7, 1), (80, 2), (9, None)):
        recovery.replayed(request, token)
        assert request.replay == replay_after
    assert recovery.mismatches == 1, f"{recovery.mismatches} mismatches counted, not 1"
    assert request.output_token_ids == [7, 8, 9], "a rebuilt token replaced a kept one"


def test_a_differing_replayed_token_is_counted_never_used() -> None:
    check_replayed_counts_and_keeps(Recovery)


@pytest.mark.parametrize("mutant", [mutants.CountsNoMismatch, mutants.KeepsRebuiltToken],
                         ids=lambda m: m.__name__)
def test_a_recovery_that_misjudges_rebuilt_tokens_is_caught(mutant: type[Recovery]) -> None:
    with pytest.raises(AssertionError):
        check_replayed_counts_and_keeps(mutant)


def check_engine_counts_differing_rebuilt_tokens(
        recovery_class: type[Recovery], reference: dict[str, list[int]], flag: Path) -> None:
    """The restarted workers resample every token differently (recovery_helpers)."""
    cfg = model_config(worker="recovery_helpers:ResamplesDifferentlyWorker",
                       worker_kwargs={"differ_flag": str(flag)})
    kept: dict[str, list[int]] = {}
    with MultiprocExecutor(cfg) as ex:
        engine = LLMEngine(ex, step_timeout=30, recovery=RESTART)
        engine.recovery = recovery = recovery_class(RESTART)

        def fault() -> None:
            kept.update(kept_tokens(engine))
            flag.touch()  # read by the next incarnation as it starts
            os.kill(ex.worker_pids[0], signal.SIGKILL)

        outputs = _run(engine, {FAULT_STEP: fault})
    [record] = recovery.records
    assert record.tokens_recomputed == sum(map(len, kept.values())) > 0
    assert recovery.mismatches == record.tokens_recomputed, (
        f"{recovery.mismatches} of {record.tokens_recomputed} differing rebuilt tokens counted")
    for rid, tokens in kept.items():
        assert outputs[rid][:len(tokens)] == tokens == reference[rid][:len(tokens)], (
            f"request {rid}: a kept token was replaced by a rebuilt one")
    assert outputs != reference  # the new tokens do differ: the workers did resample


def test_the_engine_counts_differing_rebuilt_tokens_and_keeps_its_own(
        reference: dict[str, list[int]], tmp_path: Path) -> None:
    check_engine_counts_differing_rebuilt_tokens(Recovery, reference, tmp_path / "differ")


@pytest.mark.parametrize("mutant", [mutants.CountsNoMismatch, mutants.KeepsRebuiltToken],
                         ids=lambda m: m.__name__)
def test_an_engine_that_misjudges_rebuilt_tokens_is_caught(
        reference: dict[str, list[int]], tmp_path: Path, mutant: type[Recovery]) -> None:
    with pytest.raises(AssertionError):
        check_engine_counts_differing_rebuilt_tokens(mutant, reference, tmp_path / "differ")
