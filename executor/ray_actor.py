"""The worker side of ``RayExecutor``: one Ray actor per rank runs the usual serve loop.

    driver ── deliver(msg_id, frame) ──► actor (default group, one at a time: in order)
                                           │ inbox ─► WorkerProc.run() thread: dequeue ─►
                                           │   unpickle ─► execute ─► pickle reply ─► outbox
    driver ◄── the reply frame, or None ───┘ (None: this rank does not reply to that call)
    driver ── watch() ──► "watch" group: never returns; its ref fails when the actor dies
    driver ── info(), free_port() ──► "control" group: answered even while a call runs

The frames are the executor's own wire format (executor/serialization.py): the same
unpickling, error capture, failpoints and worker spans as a local worker
(executor/worker_proc.py), only the queue ends differ.  Ray carries the frames (the
request once into the object store for every rank, each reply as the task's result).

Invariants:
- ``deliver`` returns only once the serve loop is back for the next message, so the
  worker's span for that call is written and calls never overlap.
- The serve loop never ends while the actor lives: if it does (a bug, or a SystemExit the
  worker raised for a signal) the actor's process exits, which the driver sees as a death.
- SIGTERM and SIGINT end the process at once (Ray's handler waits for the running task, so
  a worker in a long call would never exit).  Nothing else here touches signals, a death
  pipe or PDEATHSIG: Ray owns the process (it kills the actor when its owner, the driver,
  dies).
"""

from __future__ import annotations

import os
import queue
import signal
import socket
import sys
import threading
from collections.abc import Sequence
from typing import Any

import telemetry
from executor import failpoints
from executor.process_setup import ExitState
from executor.worker_base import WorkerContext
from executor.worker_proc import WorkerProc

_DONE = object()  # the serve loop asked for the next message: the last one is finished
EXIT_LOOP_ENDED = 70  # the actor's process exit code when its serve loop ended


class _Boot:
    """What ``WorkerProc`` reads of its start-up (``ctx`` and ``worker``)."""

    def __init__(self, ctx: WorkerContext, worker: str) -> None:
        self.ctx, self.worker = ctx, worker


class _Inbox:
    """The serve loop's reader: messages handed over by ``deliver``."""

    def __init__(self, done: queue.SimpleQueue[Any]) -> None:
        self.messages: queue.SimpleQueue[tuple[int, bytes]] = queue.SimpleQueue()
        self._done = done
        self._busy = False

    def read(self, deadline: float | None, hold: bool = False) -> tuple[int, bytes]:
        if self._busy:
            self._done.put(_DONE)
        self._busy = False
        message = self.messages.get()
        self._busy = True
        return message

    def ack(self) -> None:
        pass


class _Outbox:
    """The serve loop's writer: a reply goes back as ``deliver``'s result."""

    def __init__(self, done: queue.SimpleQueue[Any]) -> None:
        self._done = done

    def write(self, msg_id: int, parts: Sequence[memoryview | bytes], deadline: float | None) -> None:
        self._done.put(b"".join(parts))


class RayWorkerActor:
    """One rank.  Built cheap (``__init__``); ``start`` builds the worker, as READY does."""

    def __init__(self, sys_path: list[str], environ: dict[str, str]) -> None:
        for entry in reversed(sys_path):  # the driver's: test helpers and scripts import
            if entry not in sys.path:
                sys.path.insert(0, entry)
        os.environ.update(environ)
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, _exit_on_sigterm)
            signal.signal(signal.SIGINT, _exit_on_sigterm)
        self._done: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._inbox = _Inbox(self._done)
        self._forever = threading.Event()

    def info(self) -> tuple[int, str]:
        """This actor's pid and its Ray node's id (hex)."""
        import ray

        return os.getpid(), ray.get_runtime_context().get_node_id()

    def free_port(self) -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])

    def start(self, ctx: WorkerContext, worker: str) -> int:
        """Build the worker (``cls(ctx)``: model loading, the process group) and serve."""
        telemetry.configure_process("worker", ctx.rank)
        failpoints.install_from_env("worker", ctx.rank)
        proc = WorkerProc(_Boot(ctx, worker), ExitState(),  # type: ignore[arg-type]
                          queues=(self._inbox, _Outbox(self._done)))
        rec = telemetry.get_recorder()
        if rec.enabled:
            rec.event("worker.ready", {"faultlab.rank": ctx.rank, "process.pid": os.getpid(),
                                       "faultlab.backend": "ray"})
        threading.Thread(target=_serve, args=(proc,), name="faultlab-ray-serve", daemon=True).start()
        return os.getpid()

    def deliver(self, msg_id: int, frame: bytes) -> bytes | None:
        """Serve one request; this rank's reply frame, or None when it does not reply."""
        self._inbox.messages.put((msg_id, frame))
        reply = None
        while True:
            item = self._done.get()
            if item is _DONE:
                return reply
            reply = item

    def watch(self) -> None:
        """Never returns: the driver learns of this actor's death from this call's ref."""
        self._forever.wait()


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    """Ray's own handler exits only once the running task returns: a worker in a long call
    would never go (and the driver never learn).  Ours leaves at once, as a local worker
    does, and the driver sees the death."""
    os._exit(128 + signum)


def _serve(proc: WorkerProc) -> None:
    try:
        proc.run()
    finally:
        os._exit(EXIT_LOOP_ENDED)  # a worker that stopped serving is a dead worker
