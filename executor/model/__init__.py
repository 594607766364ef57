"""A small decoder-only transformer split across ranks, and the worker that serves it.

    ModelBatch ──► ModelWorker.execute_model (every rank) ──► ModelOutput (output rank)

``ExecutorConfig(worker="executor.model.worker:ModelWorker", worker_kwargs={...})`` where
``worker_kwargs`` may set any ``ModelConfig`` field (``seed``, ``num_layers``, ...),
``collective_timeout_s`` (gloo's deadline for one collective, default 120) and
``torch_threads`` (default 1, which keeps tokens independent of batching).
"""

from executor.model.batch import ModelBatch, ModelOutput
from executor.model.config import ModelConfig
from executor.model.parallel import CollectiveError
from executor.model.worker import ModelWorker

__all__ = ["CollectiveError", "ModelBatch", "ModelConfig", "ModelOutput", "ModelWorker"]
