"""Shared pieces of the model tests: executor configs for the model worker and prompts."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from typing import Any

import torch  # noqa: F401  (imported before any fork: see model_config)

from executor import ExecutorConfig, WorkerContext
from executor.model.prompts import make_prompts
from executor.model.transformer import StageModel
from executor.model.worker import ModelWorker

WORKER = "executor.model.worker:ModelWorker"
PROMPTS = make_prompts(seed=3, count=5, max_len=12, vocab_size=512)


def model_config(tp: int = 1, pp: int = 1, **overrides: Any) -> ExecutorConfig:
    """The model worker on ``tp`` x ``pp`` ranks, seed 0.

    Started by fork unless a test says otherwise: this process has torch imported, so a
    forked worker is ready in a tenth of a second where a forkserver child (the executor's
    choice while pytest-timeout's thread runs) spends 2-4 s importing torch on two cores.
    """
    worker_kwargs = {"seed": 0, "collective_timeout_s": 30, **overrides.pop("worker_kwargs", {})}
    overrides.setdefault("start_method", "fork")
    overrides.setdefault("worker", WORKER)
    return ExecutorConfig(tensor_parallel_size=tp, pipeline_parallel_size=pp,
                          worker_kwargs=worker_kwargs, **overrides)


def signal_later(pid: int, sig: signal.Signals, delay_s: float) -> threading.Timer:
    """Send ``sig`` to ``pid`` after ``delay_s`` seconds, from a timer thread."""
    timer = threading.Timer(delay_s, _send, args=(pid, sig))
    timer.start()
    return timer


def _send(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


class SelfKillingModelWorker(ModelWorker):
    """The model worker, SIGKILLed mid-step: on rank ``worker_kwargs["die_rank"]`` inside
    step ``worker_kwargs["die_step"]``, it logs a chaos fault (a ``chaos.fault`` span, as a
    chaos failpoint does) in the control directory ``worker_kwargs["ctl"]``, then kills
    itself.  Step ids keep growing across a restart, so the new incarnation does not."""

    def execute_model(self, batch: Any) -> Any:
        kwargs = self.ctx.worker_kwargs
        if self.ctx.rank == kwargs.get("die_rank") and batch.step_id == kwargs.get("die_step"):
            from chaos.control import ControlDir

            ControlDir(kwargs["ctl"]).log_fault({"kind": "kill_worker", "rank": self.ctx.rank,
                                                 "pid": os.getpid(), "phase": "signal"})
            os.kill(os.getpid(), signal.SIGKILL)
        return super().execute_model(batch)


class FailingModelWorker(ModelWorker):
    """The model worker, failing to load on ``worker_kwargs["fail_rank"]``.

    ``fail_when="before_init"`` fails before joining the process group (its peers wait at
    the rendezvous); ``"while_loading"`` fails after it (its peers are already READY).
    """

    def __init__(self, ctx: WorkerContext) -> None:
        if self._should_fail(ctx, "before_init"):
            raise RuntimeError(f"rank {ctx.rank}: model files missing on this host")
        super().__init__(ctx)

    def _load_model(self) -> StageModel:
        if self._should_fail(self.ctx, "while_loading"):
            raise RuntimeError(f"rank {self.ctx.rank}: weights file is corrupt")
        return super()._load_model()

    @staticmethod
    def _should_fail(ctx: WorkerContext, when: str) -> bool:
        kwargs = ctx.worker_kwargs
        return ctx.rank == kwargs.get("fail_rank") and kwargs.get("fail_when") == when
