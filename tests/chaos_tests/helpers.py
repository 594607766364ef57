"""Shared pieces of the chaos tests."""

from __future__ import annotations

import os
from typing import Any

from chaos import ScenarioResult
from executor.workers import EchoWorker


def real_violations(result: ScenarioResult) -> list[str]:
    return [str(v) for v in result.violations]


class ExitsOnSecondEcho(EchoWorker):
    """A worker that dies by itself, no fault planned: rank 1 ``os._exit(3)``s in its
    second ``echo`` (what a crashing model or a native library does)."""

    def echo(self, x: Any) -> Any:
        if self.rank == 1 and self.calls == 1:
            os._exit(3)
        return super().echo(x)


DIES_BY_ITSELF = "helpers:ExitsOnSecondEcho"  # ExecutorConfig.worker (tests/chaos_tests on sys.path)
