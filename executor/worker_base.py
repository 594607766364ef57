"""What a worker class sees: its place in the parallel layout, and the base it may extend.

The executor imports the class named by ``ExecutorConfig.worker`` ("module:Class") inside
each worker process and builds it as ``cls(ctx)``.  The constructor does all loading (a
model, a process group); it returning is what the worker reports as READY, and an exception
in it is what start-up failure reports, with this worker's own traceback.

After that, ``collective_rpc(method)`` calls ``getattr(worker, method)(*args, **kwargs)`` in
every worker (or ``method(worker, *args, **kwargs)`` when ``method`` is a callable).
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class WorkerContext:
    """One worker's place in ``world_size = tensor_parallel_size * pipeline_parallel_size``.

    Ranks are laid out tensor-parallel first: ``rank = pp_rank * tp_size + tp_rank``.  The
    output rank, the one whose reply carries model output, is the first tensor-parallel rank
    of the last pipeline stage: ``world_size - tp_size``.
    """

    rank: int
    world_size: int
    tensor_parallel_size: int
    pipeline_parallel_size: int
    # "tcp://127.0.0.1:PORT", free when the executor started, for torch.distributed.
    distributed_init_method: str
    # ExecutorConfig.worker_kwargs, passed through untouched.
    worker_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    async_scheduling: bool = False

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tensor_parallel_size

    @property
    def pp_rank(self) -> int:
        return self.rank // self.tensor_parallel_size

    @property
    def output_rank(self) -> int:
        return self.world_size - self.tensor_parallel_size

    @property
    def is_output_rank(self) -> bool:
        return self.rank == self.output_rank


class WorkerBase:
    """Optional base for worker classes: keeps the context and answers health checks."""

    def __init__(self, ctx: WorkerContext) -> None:
        self.ctx = ctx
        self.rank = ctx.rank

    def check_health(self) -> None:
        """Raise if this worker cannot serve; the default worker is always healthy."""

    def close(self) -> None:
        """Release what the constructor acquired; called once when the worker leaves its loop."""
