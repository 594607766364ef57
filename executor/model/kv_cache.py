"""Per-request key/value cache of the layers and heads this rank holds.

    execute_model ─ begin_step(batch) ─► checks positions, grows lengths
                  ─ extend(req, layer, shard, k, v) ─► the request's keys/values so far
                  ─ free(finished ids)

Keys and values are ``[local_shards, tokens, head_dim]`` per (request, layer).  ``begin_step``
checks every position before anything runs, so a batch that does not match the cache fails
on every rank alike, before any collective (a rank that raised mid-collective would leave
its peers waiting).
"""

from __future__ import annotations

import torch

from executor.model.batch import ModelBatch


class KVCache:
    """Keys and values per request; cheap to free, checked on every step."""

    def __init__(self, max_positions: int) -> None:
        self.max_positions = max_positions
        self._lengths: dict[str, int] = {}
        self._entries: dict[str, dict[int, tuple[torch.Tensor, torch.Tensor]]] = {}

    def __len__(self) -> int:
        return len(self._lengths)

    def length(self, request_id: str) -> int:
        return self._lengths.get(request_id, 0)

    def free(self, request_ids: tuple[str, ...]) -> None:
        for request_id in request_ids:
            self._lengths.pop(request_id, None)
            self._entries.pop(request_id, None)

    def begin_step(self, batch: ModelBatch) -> None:
        """Check the whole batch against the cache, then account for its tokens."""
        for request_id, tokens, position in self._rows(batch):
            self._check(request_id, position, len(tokens))
        for request_id, tokens, position in self._rows(batch):
            if position == 0:
                self.free((request_id,))
                self._entries[request_id] = {}
            self._lengths[request_id] = position + len(tokens)

    def extend(self, request_id: str, layer: int, k: torch.Tensor,
               v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append this step's keys/values and return all of the request's so far."""
        entries = self._entries[request_id]
        old = entries.get(layer)
        if old is not None:
            k, v = torch.cat([old[0], k], dim=1), torch.cat([old[1], v], dim=1)
        entries[layer] = (k, v)
        return k, v

    @staticmethod
    def _rows(batch: ModelBatch) -> zip[tuple[str, tuple[int, ...], int]]:
        return zip(batch.request_ids, batch.token_ids, batch.positions, strict=True)

    def _check(self, request_id: str, position: int, n_new: int) -> None:
        cached = self.length(request_id)
        if position != 0 and position != cached:
            raise ValueError(f"request {request_id!r}: step starts at position {position} "
                             f"but {cached} tokens are cached")
        if position + n_new > self.max_positions:
            raise ValueError(f"request {request_id!r}: {position + n_new} tokens exceed "
                             f"max_positions={self.max_positions}")
