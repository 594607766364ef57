"""The same seed gives the same greedy tokens on every parallel layout, through the real
executor; finished requests leave no KV cache on any rank.

    layout (tp, pp, async) ─► MultiprocExecutor ─► LLMEngine.generate ─► tokens == TP=1's
"""

from __future__ import annotations

import pytest
from model_helpers import PROMPTS, model_config

from executor import MultiprocExecutor, WorkerError
from executor.model.batch import ModelBatch, ModelOutput
from executor.model.engine import LLMEngine

MAX_NEW_TOKENS = 12


def _generate(tp: int, pp: int, async_scheduling: bool = False,
              start_method: str | None = "fork") -> dict[str, list[int]]:
    cfg = model_config(tp, pp, async_scheduling=async_scheduling, start_method=start_method)
    with MultiprocExecutor(cfg) as executor:
        engine = LLMEngine(executor, step_timeout=30)
        outputs = engine.generate(PROMPTS, MAX_NEW_TOKENS)
        assert executor.collective_rpc("num_cached_requests") == [0] * cfg.world_size
    return outputs


@pytest.fixture(scope="module")
def reference() -> dict[str, list[int]]:
    return _generate(tp=1, pp=1)


def test_reference_generates_every_token(reference: dict[str, list[int]]) -> None:
    assert list(reference) == list(PROMPTS)
    assert all(len(tokens) == MAX_NEW_TOKENS for tokens in reference.values())
    assert all(0 <= t < 512 for tokens in reference.values() for t in tokens)


@pytest.mark.parametrize("tp, pp, async_scheduling, start_method", [
    pytest.param(2, 1, False, "fork", id="tp2"),
    pytest.param(2, 1, False, None, id="tp2-default-start-method"),
    pytest.param(1, 2, False, "fork", id="pp2"),
    pytest.param(2, 2, False, "fork", id="tp2-pp2"),
    pytest.param(1, 1, True, "fork", id="tp1-async"),
])
def test_layout_gives_the_same_tokens(reference: dict[str, list[int]], tp: int, pp: int,
                                      async_scheduling: bool, start_method: str | None) -> None:
    assert _generate(tp, pp, async_scheduling, start_method) == reference


def test_only_the_output_rank_replies_with_tokens() -> None:
    batch = ModelBatch(0, ("a",), ((1, 2, 3),), (0,))
    with MultiprocExecutor(model_config(tp=2, pp=2)) as executor:
        replies = executor.collective_rpc("execute_model", args=(batch,))
    assert executor.output_rank == 2
    assert [type(r).__name__ for r in replies] == ["NoneType", "NoneType", "ModelOutput",
                                                   "NoneType"]
    assert isinstance(replies[2], ModelOutput) and replies[2].request_ids == ("a",)


def test_a_bad_batch_fails_on_every_rank_before_any_collective() -> None:
    """Every rank rejects it alike, so no rank waits in an all-reduce and the model serves on."""
    bad = ModelBatch(0, ("a",), ((7,),), (5,))  # position 5 but nothing cached
    good = ModelBatch(1, ("a",), ((1, 2),), (0,))
    with MultiprocExecutor(model_config(tp=2)) as executor:
        with pytest.raises(WorkerError, match="position 5 but 0 tokens are cached"):
            executor.collective_rpc("execute_model", args=(bad,), timeout=10,
                                    unique_reply_rank=executor.output_rank)
        output = executor.collective_rpc("execute_model", args=(good,), timeout=10,
                                         unique_reply_rank=executor.output_rank)
        executor.collective_rpc("check_health", timeout=10)
    assert isinstance(output, ModelOutput) and len(output.sampled_token_ids) == 1
