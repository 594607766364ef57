"""Deliberately broken executors: each breaks one promise, so each oracle can be shown failing.

They live in their own module (not a test file) so that a kill-the-driver scenario's
subprocess can import them by name.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import Future
from typing import Any

import executor.death_pipes
import executor.worker_proc
from executor import MultiprocExecutor


class DropsDeadline(MultiprocExecutor):
    """Ignores ``timeout``: a call outlives its deadline."""

    def collective_rpc(self, method: Any, timeout: float | None = None, *a: Any, **kw: Any) -> Any:
        return super().collective_rpc(method, None, *a, **kw)


class SwallowsDeath(MultiprocExecutor):
    """Never notices a dead worker: no failure, no callback, calls just time out."""

    def _on_worker_death(self, rank: int, pid: int, exitcode: int | None, detected_ns: int) -> None:
        pass


class IgnoresLostNodes(MultiprocExecutor):
    """The hub reports a lost node and the executor shrugs: calls to it just time out."""

    def _on_node_lost(self, node: int, ranks: list[int], why: str) -> None:
        pass


class CallbackTwice(MultiprocExecutor):
    """Runs the failure callbacks twice."""

    def _run_callbacks(self) -> None:
        callbacks = list(self._callbacks)
        super()._run_callbacks()
        for cb in callbacks:
            cb()


class WrongResults(MultiprocExecutor):
    """Returns another call's value for ``echo``."""

    def collective_rpc(self, method: Any, *a: Any, **kw: Any) -> Any:
        out = super().collective_rpc(method, *a, **kw)
        return ["garbage"] * self.world_size if method == "echo" else out


class UndocumentedError(MultiprocExecutor):
    """Raises a KeyError where a documented error belongs."""

    def collective_rpc(self, method: Any, *a: Any, **kw: Any) -> Any:
        if method == "sleep":
            raise KeyError("not a documented error")
        return super().collective_rpc(method, *a, **kw)


class ReversedFutures(MultiprocExecutor):
    """Resolves each pair of non-blocking calls in reverse order (values stay right)."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self._held: list[tuple[Future[Any], Future[Any]]] = []

    def collective_rpc(self, method: Any, timeout: float | None = None, args: Any = (),
                       kwargs: Any = None, non_block: bool = False, *rest: Any) -> Any:
        real = super().collective_rpc(method, timeout, args, kwargs, non_block, *rest)
        if not non_block:
            return real
        mine: Future[Any] = Future()
        self._held.append((real, mine))
        if len(self._held) == 2:
            pair, self._held = self._held, []
            threading.Timer(0.1, _resolve_reversed, args=(pair,)).start()
        return mine


def _resolve_reversed(pair: list[tuple[Future[Any], Future[Any]]]) -> None:
    for real, mine in reversed(pair):
        mine.set_result(real.result())


class SlowShutdown(MultiprocExecutor):
    """Dawdles in shutdown."""

    def shutdown(self) -> None:
        time.sleep(1.5)
        super().shutdown()


class LeaksThread(MultiprocExecutor):
    """Leaves a thread running after shutdown."""

    def shutdown(self) -> None:
        super().shutdown()
        threading.Thread(target=time.sleep, args=(4.0,), name="leaked-by-executor",
                         daemon=True).start()


class ForgetsDeathPipe(MultiprocExecutor):
    """Forked workers keep their copy of the death pipe's write end, so the driver's
    death never reaches them: they are orphaned (fork start method only)."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        original = executor.death_pipes.close_inherited
        executor.death_pipes.close_inherited = lambda: None  # inherited by forked workers
        try:
            super().__init__(*a, **kw)
        finally:
            executor.death_pipes.close_inherited = original


def leaked_segment_name() -> str:
    return f"faultlab_{os.getpid()}_broken_leak"
