"""The engine loop on the real executor: request bookkeeping, continuous batching, and tokens
that do not depend on which other requests share a batch."""

from __future__ import annotations

import pytest
from model_helpers import PROMPTS, model_config

from executor import MultiprocExecutor
from executor.model.engine import EngineStats, LLMEngine, generation_workload

LATE_PROMPT = [5, 17, 300, 2, 41]


def _alone(prompt: list[int], tokens: int) -> list[int]:
    with MultiprocExecutor(model_config()) as executor:
        return LLMEngine(executor).generate({"alone": prompt}, tokens)["alone"]


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_a_request_joining_mid_run_gets_the_tokens_it_gets_alone(async_scheduling: bool) -> None:
    with MultiprocExecutor(model_config(async_scheduling=async_scheduling)) as executor:
        engine = LLMEngine(executor, step_timeout=30)
        for request_id, prompt in PROMPTS.items():
            engine.add_request(request_id, prompt, 10)

        def join_at_step_3(stats: EngineStats) -> None:
            if stats.steps == 3:
                engine.add_request("late", LATE_PROMPT, 10)

        outputs = engine.run(progress=join_at_step_3)
        assert executor.collective_rpc("num_cached_requests") == [0]
    assert set(outputs) == {*PROMPTS, "late"}
    assert outputs["late"] == _alone(LATE_PROMPT, 10)


def test_requests_are_checked_when_added() -> None:
    with MultiprocExecutor(model_config()) as executor:
        engine = LLMEngine(executor)
        future = engine.add_request("a", [1, 2], 2)
        with pytest.raises(ValueError, match="already running"):
            engine.add_request("a", [3], 2)
        with pytest.raises(ValueError, match="needs a prompt"):
            engine.add_request("b", [], 2)
        assert not future.cancel()  # only the engine ends a request
        engine.run()
    assert len(future.result(timeout=0)) == 2
    assert engine.stats.finished_requests == engine.stats.total_requests == 1


def test_each_request_stops_at_its_own_max_new_tokens() -> None:
    with MultiprocExecutor(model_config(tp=2)) as executor:
        engine = LLMEngine(executor)
        futures = {n: engine.add_request(f"r{n}", [n + 1, 7], n) for n in (1, 4, 9)}
        engine.run()
    assert {n: len(f.result(timeout=0)) for n, f in futures.items()} == {1: 1, 4: 4, 9: 9}
    assert engine.stats.generated_tokens == 14 and engine.stats.steps == 9


def test_generation_workload_runs_the_engine_for_a_chaos_scenario() -> None:
    workload = generation_workload({"w": LATE_PROMPT}, 4, step_timeout=10)
    with MultiprocExecutor(model_config(tp=2)) as executor:
        assert workload(executor) == {"w": _alone(LATE_PROMPT, 4)}
