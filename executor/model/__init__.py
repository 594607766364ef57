"""A small decoder-only transformer split across ranks, and the worker that serves it.

    ModelBatch ──► ModelWorker.execute_model (every rank) ──► ModelOutput (output rank)

``ExecutorConfig(worker="executor.model.worker:ModelWorker", worker_kwargs={...})`` where
``worker_kwargs`` may set any ``ModelConfig`` field (``seed``, ``num_layers``, ...) and
``collective_timeout_s``.
"""

from executor.model.batch import ModelBatch, ModelOutput
from executor.model.config import ModelConfig
from executor.model.parallel import CollectiveError
from executor.model.worker import ModelWorker

__all__ = ["CollectiveError", "ModelBatch", "ModelConfig", "ModelOutput", "ModelWorker"]
