"""faultlab's multi-process executor: a driver broadcasting RPCs to worker processes.

Public names (docs/design.md, section 1.1); everything else in the package is internal.
"""

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

__all__ = [
    "CorruptMessageError",
    "ExecutorConfig",
    "ExecutorError",
    "ExecutorFailedError",
    "ForeignProcessError",
    "MultiprocExecutor",
    "QueueCorruptedError",
    "QueueFullError",
    "ReplyUnpicklingError",
    "RequestPicklingError",
    "ResourceLimitError",
    "SharedMemoryError",
    "WorkerBase",
    "WorkerContext",
    "WorkerError",
    "WorkerStartupError",
]
