"""faultlab's multi-process executor: a driver broadcasting RPCs to worker processes.

Public names (docs/design.md, section 1.1); everything else in the package is internal.
``RayExecutor`` (the same contract on Ray actors) is imported on first use: ``import
executor`` never imports ray.
"""

from typing import TYPE_CHECKING

from executor.config import ExecutorConfig
from executor.errors import (
    CorruptMessageError,
    ExecutorError,
    ExecutorFailedError,
    ForeignProcessError,
    QueueCorruptedError,
    QueueFullError,
    ReplyUnpicklingError,
    RequestPicklingError,
    ResourceLimitError,
    SharedMemoryError,
    WorkerError,
    WorkerStartupError,
)
from executor.multiproc import MultiprocExecutor
from executor.worker_base import WorkerBase, WorkerContext

if TYPE_CHECKING:
    from executor.ray_executor import RayExecutor

__all__ = [
    "CorruptMessageError",
    "ExecutorConfig",
    "ExecutorError",
    "ExecutorFailedError",
    "ForeignProcessError",
    "MultiprocExecutor",
    "QueueCorruptedError",
    "QueueFullError",
    "RayExecutor",
    "ReplyUnpicklingError",
    "RequestPicklingError",
    "ResourceLimitError",
    "SharedMemoryError",
    "WorkerBase",
    "WorkerContext",
    "WorkerError",
    "WorkerStartupError",
]


def __getattr__(name: str) -> object:
    if name == "RayExecutor":
        from executor.ray_executor import RayExecutor

        return RayExecutor
    raise AttributeError(f"module 'executor' has no attribute {name!r}")
