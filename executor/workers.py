"""Workers shipped with faultlab.

``EchoWorker`` is for tests, benchmarks and chaos suites.  The tensor-parallel model worker
lives in ``executor.model`` (it needs torch); ``executor.workers.ModelWorker`` imports it
on first use so that importing this module stays cheap.
"""

from __future__ import annotations

import os
import time
from typing import Any

from executor.worker_base import WorkerBase, WorkerContext


class EchoWorker(WorkerBase):
    """Answers with what it is given; sleeps, fails and exits on request."""

    def __init__(self, ctx: WorkerContext) -> None:
        super().__init__(ctx)
        if ctx.worker_kwargs.get("fail_on_start"):
            raise RuntimeError(f"EchoWorker rank {ctx.rank} was asked to fail on start")
        self.calls = 0

    def echo(self, x: Any) -> Any:
        self.calls += 1
        return x

    def sleep(self, seconds: float) -> float:
        time.sleep(seconds)
        return seconds

    def fail(self, message: str = "failed on purpose") -> None:
        raise ValueError(message)

    def getpid(self) -> int:
        return os.getpid()

    def get_rank(self) -> int:
        return self.rank

    def exit(self, code: int = 0) -> None:
        """Leave the process at once without cleanup, as a crashing worker would."""
        os._exit(code)

    def hold_gil(self, seconds: float) -> float:
        """Spend about ``seconds`` in one C call that never releases the GIL (``sum`` over a
        ``range``), as a worker stuck in a C kernel or a backtracking regex would: no signal
        handler and no other thread of the worker runs until it returns."""
        per_item = self._sum_cost()
        start = time.perf_counter()
        sum(range(max(1, int(seconds / per_item))))
        return time.perf_counter() - start

    @staticmethod
    def _sum_cost() -> float:
        start = time.perf_counter()
        sum(range(200_000))
        return max((time.perf_counter() - start) / 200_000, 1e-10)

    def nbytes(self, payload: Any) -> int:
        """The size of a bytes-like or tensor payload, without sending it back."""
        if hasattr(payload, "nbytes"):
            return int(payload.nbytes)
        return len(payload)


def __getattr__(name: str) -> Any:
    if name == "ModelWorker":
        from executor.model.worker import ModelWorker

        return ModelWorker
    raise AttributeError(name)
