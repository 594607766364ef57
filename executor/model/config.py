"""The model's shape and how it is split across ranks.

    ModelConfig ──► layers_for_stage(pp_rank)   which blocks a pipeline stage runs
                └─► shards_for_rank(tp_rank)     which attention heads / MLP slices a rank holds

Every linear of a block is cut into ``num_shards`` equal shards (one per attention head).
A tensor-parallel rank holds ``num_shards // tp`` consecutive shards and computes them one
by one, so each shard's matmul has the same shape whatever ``tp`` is: that, and summing the
shards' partial outputs in one fixed tree order, is what makes TP=1 and TP=2 bit-identical.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """A small decoder-only transformer: milliseconds per step on one CPU core."""

    vocab_size: int = 512
    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    mlp_size: int = 512
    max_positions: int = 1024
    seed: int = 0
    norm_eps: float = 1e-6

    @classmethod
    def from_kwargs(cls, kwargs: dict[str, Any]) -> ModelConfig:
        """Build from ``worker_kwargs``, ignoring keys that are not model fields."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in kwargs.items() if k in names})

    @property
    def num_shards(self) -> int:
        return self.num_heads

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def mlp_shard_size(self) -> int:
        return self.mlp_size // self.num_shards

    def validate(self, tp: int, pp: int) -> None:
        """Raise ``ValueError`` when this shape cannot be split ``tp`` x ``pp`` ways."""
        if self.hidden_size % self.num_heads or self.mlp_size % self.num_shards:
            raise ValueError(f"hidden {self.hidden_size} / mlp {self.mlp_size} must divide by "
                             f"the {self.num_heads} heads")
        if tp < 1 or self.num_shards % tp:
            raise ValueError(f"tensor_parallel_size={tp} must divide num_heads={self.num_heads}")
        if pp < 1 or self.num_layers % pp:
            raise ValueError(f"pipeline_parallel_size={pp} must divide num_layers="
                             f"{self.num_layers}")

    def layers_for_stage(self, pp_rank: int, pp: int) -> range:
        per_stage = self.num_layers // pp
        return range(pp_rank * per_stage, (pp_rank + 1) * per_stage)

    def shards_for_rank(self, tp_rank: int, tp: int) -> range:
        per_rank = self.num_shards // tp
        return range(tp_rank * per_rank, (tp_rank + 1) * per_rank)
