"""A small decoder-only transformer split across ranks, and the worker that serves it.

    ModelBatch ──► ModelWorker.execute_model (every rank) ──► ModelOutput (output rank)

``ExecutorConfig(worker="executor.model.worker:ModelWorker", worker_kwargs={...})`` where
``worker_kwargs`` may set any ``ModelConfig`` field (``seed``, ``num_layers``, ...),
``collective_timeout_s`` (gloo's deadline for one collective, default 120) and
``torch_threads`` (default 1, which keeps tokens independent of batching).

``executor.model.engine`` is the engine loop over it (``LLMEngine``, recovery in
``executor.model.recovery``): torch-free, so the app and chaos import it without loading
torch; only the names below that need torch load it, on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {"ModelBatch": "batch", "ModelOutput": "batch", "ModelConfig": "config",
         "CollectiveError": "parallel", "ModelWorker": "worker"}

__all__ = ["CollectiveError", "ModelBatch", "ModelConfig", "ModelOutput", "ModelWorker"]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
