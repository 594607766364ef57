"""The model's pieces, in this process: shapes, seeded weights, the KV cache's checks and the
summation order that makes tensor-parallel layouts bit-identical."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from executor.model.batch import ModelBatch
from executor.model.config import ModelConfig
from executor.model.kv_cache import KVCache
from executor.model.transformer import MIN_GEMM_ROWS, matmul, tree_sum
from executor.model.weights import build_stage_weights


def test_config_rejects_layouts_that_do_not_divide() -> None:
    with pytest.raises(ValueError, match="tensor_parallel_size=3 must divide num_heads=4"):
        ModelConfig().validate(tp=3, pp=1)
    with pytest.raises(ValueError, match="pipeline_parallel_size=3"):
        ModelConfig().validate(tp=1, pp=3)


def test_config_from_worker_kwargs_ignores_other_keys() -> None:
    cfg = ModelConfig.from_kwargs({"seed": 7, "num_layers": 2, "collective_timeout_s": 5})
    assert (cfg.seed, cfg.num_layers) == (7, 2)


def test_tensor_parallel_slices_are_the_full_weights() -> None:
    cfg = ModelConfig()
    full = build_stage_weights(cfg, tp_rank=0, tp=1, pp_rank=0, pp=1)
    halves = [build_stage_weights(cfg, tp_rank=r, tp=2, pp_rank=0, pp=1) for r in (0, 1)]
    for name in ("qkv", "up"):
        joined = torch.cat([getattr(h.layers[0], name) for h in halves], dim=1)
        assert torch.equal(joined, getattr(full.layers[0], name))
    for name in ("out", "down"):
        joined = torch.cat([getattr(h.layers[3], name) for h in halves], dim=0)
        assert torch.equal(joined, getattr(full.layers[3], name))


def test_pipeline_stages_split_layers_and_ends() -> None:
    cfg = ModelConfig()
    first, last = (build_stage_weights(cfg, 0, 1, p, 2) for p in (0, 1))
    assert sorted(first.layers) == [0, 1] and sorted(last.layers) == [2, 3]
    assert first.embed is not None and first.lm_head is None
    assert last.embed is None and last.lm_head is not None
    assert torch.equal(last.layers[2].qkv, build_stage_weights(cfg, 0, 1, 0, 1).layers[2].qkv)


def test_weights_depend_on_the_seed_only() -> None:
    a, b = (build_stage_weights(ModelConfig(seed=1), 0, 1, 0, 1) for _ in range(2))
    c = build_stage_weights(ModelConfig(seed=2), 0, 1, 0, 1)
    assert a.embed is not None and b.embed is not None and c.embed is not None
    assert torch.equal(a.embed, b.embed) and not torch.equal(a.embed, c.embed)


@pytest.fixture
def one_thread() -> Iterator[None]:
    """The worker's setting: with more threads, GEMM rows depend on the row count."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.usefixtures("one_thread")
def test_matmul_rows_do_not_depend_on_batch_size() -> None:
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(40, 128, generator=gen), torch.randn(128, 384, generator=gen)
    whole = matmul(x, w)
    for rows in range(1, 2 * MIN_GEMM_ROWS):
        assert torch.equal(matmul(x[:rows], w), whole[:rows])


def test_tree_sum_matches_two_ranks_adding_their_halves() -> None:
    gen = torch.Generator().manual_seed(0)
    parts = list(torch.randn(4, 8, 128, generator=gen))
    two_ranks = tree_sum(parts[:2]) + tree_sum(parts[2:])
    assert torch.equal(tree_sum(parts), two_ranks)


def _batch(step: int, rows: dict[str, tuple[list[int], int]]) -> ModelBatch:
    return ModelBatch(step, tuple(rows), tuple(tuple(t) for t, _ in rows.values()),
                      tuple(p for _, p in rows.values()))


def test_kv_cache_checks_positions_before_changing_anything() -> None:
    kv = KVCache(max_positions=16)
    kv.begin_step(_batch(0, {"a": ([1, 2, 3], 0)}))
    with pytest.raises(ValueError, match="position 5 but 3 tokens are cached"):
        kv.begin_step(_batch(1, {"b": ([1], 0), "a": ([4], 5)}))
    assert kv.length("a") == 3 and kv.length("b") == 0
    kv.begin_step(_batch(2, {"a": ([4], 3)}))
    assert kv.length("a") == 4
    kv.free(("a",))
    assert len(kv) == 0


def test_kv_cache_refuses_to_grow_past_max_positions() -> None:
    with pytest.raises(ValueError, match="exceed max_positions=4"):
        KVCache(max_positions=4).begin_step(_batch(0, {"a": ([1] * 5, 0)}))


@pytest.mark.parametrize("kwargs, message", [
    ({"request_ids": ("a",)}, "1 requests but 0 token lists"),
    ({"request_ids": ("a", "a"), "token_ids": ((1,), (2,)), "positions": (0, 0)}, "twice"),
    ({"request_ids": ("a",), "token_ids": ((),), "positions": (0,)}, "at least one token"),
])
def test_batch_rejects_malformed_steps(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ModelBatch(step_id=0, **kwargs)
