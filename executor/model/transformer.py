"""One rank's part of the decoder-only transformer: the forward pass of a pipeline stage.

    token ids ─► embed + pos (stage 0) ─┐        or  hidden ◄─ recv (later stages)
                                        ▼
      for each layer of this stage:  x += all_reduce(Σ_shards attn_s(norm(x)))
                                     x += all_reduce(Σ_shards mlp_s(norm(x)))
                                        ▼
      hidden ─► send (not last stage)   or   norm ─► lm_head ─► logits (last stage)

Rows of ``x`` are the batch's new tokens, request after request.  Each shard (one head plus
one MLP slice) is a column-parallel linear followed by a row-parallel one; a rank sums its
shards' partial outputs in a fixed tree and the all-reduce adds the ranks' sums.  Attention
runs per request and per head against that request's KV cache.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from executor.model.batch import ModelBatch
from executor.model.config import ModelConfig
from executor.model.kv_cache import KVCache
from executor.model.parallel import ParallelGroups
from executor.model.weights import LayerWeights, ShardWeights, StageWeights

# CPU GEMM takes a different kernel (another summation order) for fewer than 4 rows, so a
# token's result would depend on how many tokens share its batch.  Padding to 4 rows keeps
# every row bit-identical however the engine groups requests.
MIN_GEMM_ROWS = 4


def matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x @ w`` whose rows do not depend on how many rows ``x`` has."""
    rows = x.shape[0]
    if rows >= MIN_GEMM_ROWS:
        return x @ w
    padded = torch.cat([x, x.new_zeros(MIN_GEMM_ROWS - rows, x.shape[1])])
    return (padded @ w)[:rows]


def tree_sum(parts: list[torch.Tensor]) -> torch.Tensor:
    """Sum pairwise, ((p0 + p1) + (p2 + p3)): the same order whether one rank holds all
    shards or two ranks hold two each and the all-reduce adds their sums."""
    while len(parts) > 1:
        pairs = [parts[i] + parts[i + 1] for i in range(0, len(parts) - 1, 2)]
        parts = pairs + ([parts[-1]] if len(parts) % 2 else [])
    return parts[0]


class StageModel:
    """Runs this rank's layers over a batch, using and growing the KV cache."""

    def __init__(self, cfg: ModelConfig, weights: StageWeights, groups: ParallelGroups,
                 kv: KVCache, shards: range) -> None:
        self.cfg, self.w, self.groups, self.kv, self.shards = cfg, weights, groups, kv, shards

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        scale = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.cfg.norm_eps)
        return x * scale * weight

    def embed(self, batch: ModelBatch) -> torch.Tensor:
        assert self.w.embed is not None and self.w.pos_embed is not None
        tokens = torch.tensor([t for ts in batch.token_ids for t in ts], dtype=torch.long)
        positions = torch.cat([torch.arange(p, p + len(ts))
                               for p, ts in zip(batch.positions, batch.token_ids, strict=True)])
        return self.w.embed[tokens] + self.w.pos_embed[positions]

    def run_layers(self, batch: ModelBatch, x: torch.Tensor) -> torch.Tensor:
        for index, layer in sorted(self.w.layers.items()):
            x = x + self._attention(batch, index, layer, self.rms_norm(x, layer.attn_norm))
            x = x + self._mlp(layer, self.rms_norm(x, layer.mlp_norm))
        return x

    def logits(self, batch: ModelBatch, x: torch.Tensor) -> torch.Tensor:
        """Logits of each request's last new token: ``[requests, vocab]``."""
        assert self.w.final_norm is not None and self.w.lm_head is not None
        ends = torch.tensor([len(ts) for ts in batch.token_ids]).cumsum(0) - 1
        last = self.rms_norm(x[ends], self.w.final_norm)
        return matmul(last, self.w.lm_head)

    def _mlp(self, layer: LayerWeights, x: torch.Tensor) -> torch.Tensor:
        parts = [matmul(F.gelu(matmul(x, s.up)), s.down) for s in layer.shards]
        return self.groups.all_reduce(tree_sum(parts))

    def _attention(self, batch: ModelBatch, index: int, layer: LayerWeights,
                   x: torch.Tensor) -> torch.Tensor:
        parts = [self._attention_shard(batch, index, shard_id, shard, x)
                 for shard_id, shard in zip(self.shards, layer.shards, strict=True)]
        return self.groups.all_reduce(tree_sum(parts))

    def _attention_shard(self, batch: ModelBatch, index: int, shard_id: int,
                         shard: ShardWeights, x: torch.Tensor) -> torch.Tensor:
        q, k, v = matmul(x, shard.qkv).split(self.cfg.head_dim, dim=1)
        outputs, start = [], 0
        for request_id, tokens, position in zip(batch.request_ids, batch.token_ids,
                                                batch.positions, strict=True):
            rows = slice(start, start + len(tokens))
            keys, values = self.kv.extend(request_id, index, shard_id, k[rows], v[rows])
            outputs.append(self._attend(q[rows], keys, values, position))
            start += len(tokens)
        return matmul(torch.cat(outputs), shard.out)

    def _attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                position: int) -> torch.Tensor:
        """Causal attention of ``q`` (new tokens from ``position`` on) over all keys."""
        scores = matmul(q, keys.t().contiguous()) / math.sqrt(self.cfg.head_dim)
        query_pos = torch.arange(position, position + q.shape[0])[:, None]
        future = torch.arange(keys.shape[0])[None, :] > query_pos
        weights = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
        return matmul(weights, values)
