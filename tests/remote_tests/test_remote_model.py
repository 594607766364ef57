"""torch.distributed across nodes: TP=2 with one rank per node gives TP=1's tokens."""

from __future__ import annotations

import torch  # noqa: F401  (imported before any fork, as in tests/model)
from conftest import TwoNodes

from executor import ExecutorConfig, MultiprocExecutor
from executor.model.engine import LLMEngine
from executor.model.prompts import make_prompts

PROMPTS = make_prompts(seed=3, count=5, max_len=12, vocab_size=512)
MODEL = {"worker": "executor.model.worker:ModelWorker",
         "worker_kwargs": {"seed": 0, "collective_timeout_s": 30}}


def _generate(ex: MultiprocExecutor) -> dict[str, list[int]]:
    engine = LLMEngine(ex, step_timeout=30)
    outputs = engine.generate(PROMPTS, 12)
    assert ex.collective_rpc("num_cached_requests") == [0] * ex.world_size
    return outputs


def test_tp2_with_one_rank_per_node_gives_the_tp1_tokens(two_nodes: TwoNodes) -> None:
    with MultiprocExecutor(ExecutorConfig(start_method="fork", **MODEL)) as local:  # type: ignore[arg-type]
        reference = _generate(local)
    remote = two_nodes.start(**MODEL)
    assert remote.output_rank == 0
    assert _generate(remote) == reference
