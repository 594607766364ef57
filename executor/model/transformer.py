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
from executor.model.weights import LayerWeights, StageWeights

# CPU GEMM takes a different kernel (another summation order) for fewer than 4 rows, so a
# token's result would depend on how many tokens share its batch.  Padding to 4 rows keeps
# every row bit-identical however the engine groups requests.
MIN_GEMM_ROWS = 4


def matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x @ w`` (batched over leading dims) whose rows do not depend on how many rows
    ``x`` has."""
    rows = x.shape[-2]
    if rows >= MIN_GEMM_ROWS:
        return torch.matmul(x, w)
    pad = x.new_zeros(*x.shape[:-2], MIN_GEMM_ROWS - rows, x.shape[-1])
    return torch.matmul(torch.cat([x, pad], dim=-2), w)[..., :rows, :]


def tree_sum(parts: list[torch.Tensor]) -> torch.Tensor:
    """Sum pairwise, ((p0 + p1) + (p2 + p3)): the same order whether one rank holds all
    shards or two ranks hold two each and the all-reduce adds their sums."""
    while len(parts) > 1:
        pairs = [parts[i] + parts[i + 1] for i in range(0, len(parts) - 1, 2)]
        parts = pairs + ([parts[-1]] if len(parts) % 2 else [])
    return parts[0]


def by_shard(x: torch.Tensor, num_shards: int) -> torch.Tensor:
    """``[tokens, shards * width]`` -> ``[shards, tokens, width]``."""
    return x.view(x.shape[0], num_shards, -1).transpose(0, 1).contiguous()


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

    def _row_parallel(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """Per-shard partial outputs ``x[s] @ w[s]``, summed in tree order, then across
        the stage's tensor-parallel ranks."""
        partials = matmul(x, w).unbind(0)
        return self.groups.all_reduce(tree_sum(list(partials)))

    def _mlp(self, layer: LayerWeights, x: torch.Tensor) -> torch.Tensor:
        hidden = F.gelu(matmul(x, layer.up))
        return self._row_parallel(by_shard(hidden, len(self.shards)), layer.down)

    def _attention(self, batch: ModelBatch, index: int, layer: LayerWeights,
                   x: torch.Tensor) -> torch.Tensor:
        qkv = by_shard(matmul(x, layer.qkv), len(self.shards))  # [shards, tokens, 3 * d]
        q, k, v = qkv.split(self.cfg.head_dim, dim=-1)  # type: ignore[no-untyped-call]
        outputs, start = [], 0
        for request_id, tokens, position in zip(batch.request_ids, batch.token_ids,
                                                batch.positions, strict=True):
            rows = slice(start, start + len(tokens))
            keys, values = self.kv.extend(request_id, index, k[:, rows], v[:, rows])
            outputs.append(self._attend(q[:, rows], keys, values, position))
            start += len(tokens)
        return self._row_parallel(torch.cat(outputs, dim=1), layer.out)

    def _attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                position: int) -> torch.Tensor:
        """Causal attention of ``q`` ``[shards, new, d]`` (new tokens from ``position`` on)
        over the request's keys and values ``[shards, all, d]``.  Shapes depend only on the
        request, never on the rest of the batch."""
        scores = torch.matmul(q, keys.transpose(1, 2)) / math.sqrt(self.cfg.head_dim)
        if q.shape[1] > 1:
            query_pos = torch.arange(position, position + q.shape[1])[:, None]
            future = torch.arange(keys.shape[1])[None, :] > query_pos
            scores = scores.masked_fill(future, float("-inf"))
        return torch.matmul(torch.softmax(scores, dim=-1), values)
