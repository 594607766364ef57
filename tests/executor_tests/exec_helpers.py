"""Objects that misbehave in one phase of a call, importable by worker processes."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Any

from executor.workers import EchoWorker


def _raise(message: str) -> None:
    raise ValueError(message)


class RaiseOnUnpickle:
    """Pickles fine; unpickling it raises ValueError."""

    def __reduce__(self) -> tuple[Any, ...]:
        return _raise, ("raised while unpickling",)


class ExitOnUnpickle:
    """Pickles fine; unpickling it calls sys.exit(7)."""

    def __reduce__(self) -> tuple[Any, ...]:
        return sys.exit, (7,)


class Unpicklable:
    def __init__(self) -> None:
        self.lock = threading.Lock()


def return_unpicklable(worker: Any) -> Any:
    return threading.Lock()


def return_exit_on_unpickle(worker: Any) -> Any:
    return ExitOnUnpickle()


def call_sys_exit(worker: Any) -> None:
    sys.exit(2)


def exit_in_rank(worker: Any, rank: int, code: int) -> None:
    if worker.rank == rank:
        os._exit(code)


def ignore_sigterm_and_sleep(worker: Any, seconds: float) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(seconds)


class SlowStartWorker(EchoWorker):
    def __init__(self, ctx: Any) -> None:
        time.sleep(float(ctx.worker_kwargs.get("delay", 30)))
        super().__init__(ctx)


class ExitOnStartWorker(EchoWorker):
    def __init__(self, ctx: Any) -> None:
        if ctx.rank == 1:
            os._exit(9)
        super().__init__(ctx)


def sleep_in_flight(ex: Any) -> tuple[threading.Thread, list[BaseException]]:
    """A 30 s ``sleep`` call running on a thread; what it raised lands in the list."""
    errors: list[BaseException] = []

    def call() -> None:
        try:
            ex.collective_rpc("sleep", args=(30,), timeout=60)
        except BaseException as exc:  # noqa: BLE001 - the test inspects whatever it was
            errors.append(exc)

    thread = threading.Thread(target=call)
    thread.start()
    return thread, errors
