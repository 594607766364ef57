"""The ranks' process groups: all-reduce inside a pipeline stage, send/recv between stages.

    rank = pp_rank * tp + tp_rank

    stage 0:  rank 0 ── all_reduce ── rank 1          (TP group of stage 0)
                │ send                  │ send
                ▼                       ▼
    stage 1:  rank 2 ── all_reduce ── rank 3          (TP group of stage 1; rank 2 = output)

Everything runs on gloo over TCP on the CPU.  A collective that fails (a peer died: gloo
sees the closed connection) or times out is re-raised as ``CollectiveError`` naming this
rank, the operation and the peers, and marks the rank unhealthy: its model state no longer
matches its peers'.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from executor.worker_base import WorkerContext

T = TypeVar("T")


class CollectiveError(RuntimeError):
    """A torch.distributed operation failed or timed out on this rank."""


class ParallelGroups:
    """This rank's process groups; ``close()`` destroys them."""

    def __init__(self, ctx: WorkerContext, timeout_s: float) -> None:
        self.ctx = ctx
        self.tp = ctx.tensor_parallel_size
        self.broken: str | None = None  # why a collective failed; None while healthy
        dist.init_process_group("gloo", init_method=ctx.distributed_init_method,
                                rank=ctx.rank, world_size=ctx.world_size,
                                timeout=datetime.timedelta(seconds=timeout_s))
        self.tp_ranks = self._stage_ranks(ctx.pp_rank)
        self.tp_group = self._new_tp_groups()

    def _stage_ranks(self, pp_rank: int) -> list[int]:
        return list(range(pp_rank * self.tp, (pp_rank + 1) * self.tp))

    def _new_tp_groups(self) -> Any:
        """Every rank must create every group, in the same order; keep our own stage's."""
        if self.ctx.pipeline_parallel_size == 1:
            return dist.group.WORLD
        groups = [dist.new_group(self._stage_ranks(p))
                  for p in range(self.ctx.pipeline_parallel_size)]
        return groups[self.ctx.pp_rank]

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum ``tensor`` in place over this stage's tensor-parallel ranks."""
        if self.tp > 1:
            self._guard(f"all_reduce over ranks {self.tp_ranks}",
                        lambda: dist.all_reduce(tensor, group=self.tp_group))
        return tensor

    def send_to_next_stage(self, tensor: torch.Tensor) -> None:
        dst = self.ctx.rank + self.tp
        self._guard(f"send to rank {dst}", lambda: dist.send(tensor, dst=dst))

    def recv_from_prev_stage(self, shape: tuple[int, ...]) -> torch.Tensor:
        src = self.ctx.rank - self.tp
        buf = torch.empty(shape, dtype=torch.float32)
        self._guard(f"recv from rank {src}", lambda: dist.recv(buf, src=src))
        return buf

    def _guard(self, what: str, op: Callable[[], T]) -> T:
        if self.broken is not None:
            raise CollectiveError(f"rank {self.ctx.rank}: refusing {what}: an earlier "
                                  f"collective failed ({self.broken})")
        try:
            return op()
        except RuntimeError as exc:
            self.broken = f"{what}: {exc}"
            raise CollectiveError(f"rank {self.ctx.rank}: {what} failed (a peer rank died, "
                                  f"hung or timed out): {exc}") from exc

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
