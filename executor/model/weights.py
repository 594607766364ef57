"""Seeded weights: every rank draws the full model from one seed, then keeps its slice.

    torch.Generator(seed) ──► full tensors, always drawn in the same order
                                 │ slice by (pp stage → layers, tp rank → shards)
                                 ▼
                             StageWeights for this rank

Drawing the full model on every rank (a few MB, a few ms) keeps the random stream the same
whatever the layout, so TP=1, TP=2 and PP=2 compute the same function.  Weights are stored
as ``[in, out]`` so a linear is ``x @ w``.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from executor.model.config import ModelConfig


@dataclasses.dataclass
class LayerWeights:
    """One block's weights for this rank's shards (one shard = one head + one MLP slice).

    Column-parallel weights hold the local shards side by side; row-parallel ones are
    stacked per shard, so each shard's partial output can be summed in a fixed order.
    """

    attn_norm: torch.Tensor  # [hidden]
    qkv: torch.Tensor  # [hidden, local_shards * 3 * head_dim]: q|k|v of shard 0, then 1, ...
    out: torch.Tensor  # [local_shards, head_dim, hidden]
    mlp_norm: torch.Tensor  # [hidden]
    up: torch.Tensor  # [hidden, local_shards * mlp_shard]
    down: torch.Tensor  # [local_shards, mlp_shard, hidden]


@dataclasses.dataclass
class StageWeights:
    """What one rank holds.  Embeddings on the first stage, head on the last."""

    layers: dict[int, LayerWeights]
    embed: torch.Tensor | None = None
    pos_embed: torch.Tensor | None = None
    final_norm: torch.Tensor | None = None
    lm_head: torch.Tensor | None = None


class _Draw:
    """Draws tensors from one generator in call order."""

    def __init__(self, seed: int) -> None:
        self.gen = torch.Generator().manual_seed(seed)

    def linear(self, fan_in: int, fan_out: int) -> torch.Tensor:
        w = torch.randn(fan_in, fan_out, generator=self.gen)
        return w / math.sqrt(fan_in)

    def norm(self, size: int) -> torch.Tensor:
        return 1.0 + 0.1 * torch.randn(size, generator=self.gen)

    def embedding(self, rows: int, size: int) -> torch.Tensor:
        return torch.randn(rows, size, generator=self.gen)


def _full_layer(cfg: ModelConfig, draw: _Draw) -> dict[str, torch.Tensor]:
    h, f = cfg.hidden_size, cfg.mlp_size
    return {
        "attn_norm": draw.norm(h), "wq": draw.linear(h, h), "wk": draw.linear(h, h),
        "wv": draw.linear(h, h), "wo": draw.linear(h, h),
        "mlp_norm": draw.norm(h), "up": draw.linear(h, f), "down": draw.linear(f, h),
    }


def _layer(cfg: ModelConfig, full: dict[str, torch.Tensor], shards: range) -> LayerWeights:
    d, f = cfg.head_dim, cfg.mlp_shard_size
    heads = [slice(s * d, (s + 1) * d) for s in shards]
    mlp = [slice(s * f, (s + 1) * f) for s in shards]
    qkv = [full[name][:, h] for h in heads for name in ("wq", "wk", "wv")]
    return LayerWeights(
        attn_norm=full["attn_norm"], mlp_norm=full["mlp_norm"],
        qkv=torch.cat(qkv, dim=1).contiguous(),
        out=torch.stack([full["wo"][h] for h in heads]).contiguous(),
        up=torch.cat([full["up"][:, m] for m in mlp], dim=1).contiguous(),
        down=torch.stack([full["down"][m] for m in mlp]).contiguous())


def build_stage_weights(cfg: ModelConfig, tp_rank: int, tp: int, pp_rank: int,
                        pp: int) -> StageWeights:
    """Draw the whole model from ``cfg.seed`` and keep what rank (tp_rank, pp_rank) runs."""
    draw = _Draw(cfg.seed)
    embed = draw.embedding(cfg.vocab_size, cfg.hidden_size)
    pos_embed = 0.1 * draw.embedding(cfg.max_positions, cfg.hidden_size)
    mine, shards = cfg.layers_for_stage(pp_rank, pp), cfg.shards_for_rank(tp_rank, tp)
    layers = {}
    for i in range(cfg.num_layers):
        full = _full_layer(cfg, draw)
        if i in mine:
            layers[i] = _layer(cfg, full, shards)
    final_norm, lm_head = draw.norm(cfg.hidden_size), draw.linear(cfg.hidden_size,
                                                                   cfg.vocab_size)
    first, last = pp_rank == 0, pp_rank == pp - 1
    return StageWeights(layers=layers, embed=embed if first else None,
                        pos_embed=pos_embed if first else None,
                        final_norm=final_norm if last else None,
                        lm_head=lm_head if last else None)
