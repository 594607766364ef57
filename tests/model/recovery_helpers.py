"""A model worker whose rebuilt tokens differ, importable by worker processes."""

from __future__ import annotations

import os
from typing import Any

import torch

from executor import WorkerContext
from executor.model.worker import ModelWorker


class ResamplesDifferentlyWorker(ModelWorker):
    """Samples argmax's id + 1 (mod the vocabulary) instead of argmax's when the file
    ``worker_kwargs["differ_flag"]`` exists as it starts: create it before a fault and the
    restarted incarnation's tokens, the rebuilt ones first, all differ from the first run's."""

    def __init__(self, ctx: WorkerContext) -> None:
        super().__init__(ctx)
        self.differs = os.path.exists(ctx.worker_kwargs["differ_flag"])

    def sample_tokens(self, logits: torch.Tensor) -> list[int]:
        tokens = super().sample_tokens(logits)
        if not self.differs:
            return tokens
        return [(t + 1) % self.cfg.vocab_size for t in tokens]


def kept_tokens(engine: Any) -> dict[str, list[int]]:
    """Each unfinished request's output tokens so far (what a recovery must keep)."""
    return {rid: list(r.output_token_ids) for rid, r in engine._requests.items()}
