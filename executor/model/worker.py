"""The model worker: one rank of the tensor/pipeline-parallel transformer.

    executor ── collective_rpc("execute_model", batch) ──► every rank
                                                             │ free finished KV, check batch
      stage 0:  embed ─► layers ─► send ──────────┐          │
      stage k:  recv ◄────────────────────────────┘ ─► layers ─► (send | norm, lm_head)
      output rank (first TP rank of the last stage): sample_tokens ─► ModelOutput
      every other rank: None

Every rank must run every batch, in the same order: the all-reduces and send/recvs pair
them up.  The constructor loads everything (process groups, weights), so a failure there is
a start-up failure with this worker's traceback.
"""

from __future__ import annotations

import faulthandler
import io
import logging
import os
import signal
import sys
import time

import torch

from executor.model.batch import ModelBatch, ModelOutput
from executor.model.config import ModelConfig
from executor.model.kv_cache import KVCache
from executor.model.parallel import ParallelGroups
from executor.model.transformer import StageModel
from executor.model.weights import build_stage_weights
from executor.worker_base import WorkerBase, WorkerContext

log = logging.getLogger(__name__)

DEFAULT_COLLECTIVE_TIMEOUT_S = 120.0


def _configure_torch(threads: int) -> None:
    """One intra-op thread by default.

    One thread, whatever OMP_NUM_THREADS the executor chose: with two threads a CPU GEMM
    splits rows differently by row count, so a token's logits (and greedy choice) would
    depend on which other requests share its batch.  ``worker_kwargs["torch_threads"]``
    overrides this, at the price of that guarantee.

    ``torch.use_deterministic_algorithms`` is not called: every op here is deterministic on
    the CPU already, and the call imports torch._inductor, which costs 2-4 s per worker.
    """
    torch.set_num_threads(threads)
    # A rank that hangs in a collective is opaque from outside; SIGUSR1 prints its stacks.
    try:
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    except (AttributeError, ValueError, io.UnsupportedOperation):
        # sys.stderr has no file descriptor (a caller under pytest's capsys, a notebook):
        # the process's own stderr then; a worker that failed to start here was the bug.
        if sys.__stderr__ is not None:
            faulthandler.register(signal.SIGUSR1, file=sys.__stderr__, all_threads=True)
    log.info("model worker: %d torch intra-op thread(s) (worker_kwargs torch_threads; "
             "OMP_NUM_THREADS=%s)", threads, os.environ.get("OMP_NUM_THREADS"))


class ModelWorker(WorkerBase):
    """Holds one rank's weights, KV cache and process groups; runs batches."""

    def __init__(self, ctx: WorkerContext) -> None:
        super().__init__(ctx)
        kwargs = dict(ctx.worker_kwargs)
        _configure_torch(int(kwargs.get("torch_threads", 1)))
        self.cfg = ModelConfig.from_kwargs(kwargs)
        self.cfg.validate(ctx.tensor_parallel_size, ctx.pipeline_parallel_size)
        timeout_s = float(kwargs.get("collective_timeout_s", DEFAULT_COLLECTIVE_TIMEOUT_S))
        self.groups = ParallelGroups(ctx, timeout_s)
        self.kv = KVCache(self.cfg.max_positions)
        self.model = self._load_model()
        self._closed = False

    def _load_model(self) -> StageModel:
        ctx, tp, pp = self.ctx, self.ctx.tensor_parallel_size, self.ctx.pipeline_parallel_size
        weights = build_stage_weights(self.cfg, ctx.tp_rank, tp, ctx.pp_rank, pp)
        shards = self.cfg.shards_for_rank(ctx.tp_rank, tp)
        return StageModel(self.cfg, weights, self.groups, self.kv, shards)

    @property
    def is_first_stage(self) -> bool:
        return self.ctx.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.ctx.pp_rank == self.ctx.pipeline_parallel_size - 1

    @torch.inference_mode()
    def execute_model(self, batch: ModelBatch) -> ModelOutput | None:
        """Run one step on this rank; the output rank returns the sampled tokens."""
        start = time.perf_counter()
        self.check_health()
        self.kv.free(batch.finished_request_ids)
        if not batch.request_ids:
            return self._output(batch, [], start)
        self.kv.begin_step(batch)
        hidden = self._stage_input(batch)
        hidden = self.model.run_layers(batch, hidden)
        if not self.is_last_stage:
            self.groups.send_to_next_stage(hidden)
            return None
        if not self.ctx.is_output_rank:
            return None
        return self._output(batch, self.sample_tokens(self.model.logits(batch, hidden)), start)

    def _stage_input(self, batch: ModelBatch) -> torch.Tensor:
        if self.is_first_stage:
            return self.model.embed(batch)
        return self.groups.recv_from_prev_stage((batch.num_tokens, self.cfg.hidden_size))

    def _output(self, batch: ModelBatch, tokens: list[int], start: float) -> ModelOutput | None:
        if not self.ctx.is_output_rank:
            return None
        return ModelOutput(step_id=batch.step_id, request_ids=batch.request_ids,
                           sampled_token_ids=tuple(tokens),
                           model_time_s=time.perf_counter() - start)

    def sample_tokens(self, logits: torch.Tensor) -> list[int]:
        """Greedy sampling: the highest logit of each row (ties go to the lowest id)."""
        return [int(t) for t in torch.argmax(logits, dim=-1).tolist()]

    def num_cached_requests(self) -> int:
        """How many requests hold KV cache on this rank (finished ones should not)."""
        return len(self.kv)

    def check_health(self) -> None:
        if self._closed:
            raise RuntimeError(f"rank {self.rank}: model worker is closed")
        if self.groups.broken is not None:
            raise RuntimeError(f"rank {self.rank}: unhealthy since a collective failed: "
                               f"{self.groups.broken}")

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.groups.close()
