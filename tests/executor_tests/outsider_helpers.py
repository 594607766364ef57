"""Hostile objects and worker-side helpers for the outsider regression tests, importable by
worker processes under every start method."""

from __future__ import annotations

import os
import time
from typing import Any

from executor import failpoints
from executor.workers import EchoWorker


class StrRaises(Exception):
    """An exception whose ``__str__`` raises."""

    def __str__(self) -> str:
        raise RuntimeError("no str for you")


class ReduceExits(Exception):
    """An exception (or value) whose pickling calls sys.exit."""

    def __reduce__(self) -> Any:
        raise SystemExit(3)


def raise_str_raises(worker: Any) -> None:
    raise StrRaises("hidden")


def raise_reduce_exits(worker: Any) -> None:
    raise ReduceExits("cannot travel")


def return_reduce_exits(worker: Any) -> Any:
    return ReduceExits("cannot travel")


class HostileInitWorker(EchoWorker):
    def __init__(self, ctx: Any) -> None:
        raise StrRaises("in __init__")


def fork_lingering_child(worker: Any, seconds: float) -> int:
    """Fork a grandchild that inherits everything and sleeps; return its pid."""
    pid = os.fork()
    if pid == 0:
        time.sleep(seconds)
        os._exit(0)
    return pid


_damaged: list[int] = []


def damage_next_reply_meta(worker: Any, rank: int, at: int) -> None:
    """On ``rank``: flip a metadata byte of its next reply chunk (before it is published)."""
    if worker.rank != rank:
        return

    def action(ring: Any, index: int, msg_id: int, **_: object) -> None:
        if "reply" in ring.spec.name and not _damaged:
            _damaged.append(index)
            ring.buf[ring.metas[index] + at] ^= 0x40

    failpoints.enable("queue.before_publish", action)


DRIVER_PID_VAR = "FAULTLAB_TEST_DRIVER_PID"  # set in the driver after its workers started
interrupted: list[int] = []


class InterruptOnceInDriver:
    """Travels to the workers and back; rebuilding it in the driver raises KeyboardInterrupt
    the first time, as a Ctrl-C landing while the reply is unpickled would."""

    def __reduce__(self) -> Any:
        return _rebuild_interrupt_once, ()


def _rebuild_interrupt_once() -> Any:
    if os.environ.get(DRIVER_PID_VAR) != str(os.getpid()):
        return InterruptOnceInDriver()  # in a worker: echo it back as it came
    if not interrupted:
        interrupted.append(1)
        raise KeyboardInterrupt
    return "rebuilt"
