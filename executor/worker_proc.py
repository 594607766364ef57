"""The worker process: one loop that serves broadcast calls until told to leave.

    rpc queue ─► dequeue ─► unpickle ─► execute ─► pickle reply ─► reply queue ─► driver
                   ▲                                   │ (async scheduling: a reply thread
                   │ interrupt                         ▼  pickles and enqueues instead)
    death pipe ────┴── EOF ─► watcher thread ─► SIGTERM to self ─► (grace) ─► os._exit
    process set-up (signals, PDEATHSIG, fd hygiene, the watcher): executor/process_setup.py

Invariants:
- Every request this rank must answer gets exactly one reply with the request's id, whatever
  fails: unpickling, the method (exceptions, ``sys.exit``), or pickling the result.
- Only the driver holds the death pipe's write end (a forked child closes its inherited
  copy first thing), so EOF means "the driver is gone or wants us gone".  An idle worker
  sees it inside its queue wait; a busy one is interrupted by SIGTERM; one stuck in C code
  (a gloo collective) is ended by ``os._exit`` after a short grace.
- The kernel sends SIGCONT when the parent dies (``PR_SET_PDEATHSIG``), so even a
  SIGSTOPped worker wakes up to see the EOF.  SIGCONT is harmless to a running process,
  which matters because the "parent" is the thread that started the process.
- SIGTERM/SIGINT raise ``SystemExit`` once; further signals are ignored while cleaning up.
- A damaged queue is reported to the driver (FATAL) and ends the process with
  ``EXIT_QUEUE_CORRUPTED``: a reader that lost sync can never trust the ring again.
- A worker that exits for a cause of its own says so first, on its READY pipe (kept open
  after READY): ``(EXIT_CAUSE, code, cause)``, one small write that outlives the process.
  The driver names a cause only from that message, so a user's ``os._exit(4)`` is just code 4.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
import queue
import sys
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

import telemetry
from executor import failpoints
from executor.errors import CorruptMessageError, QueueCorruptedError
from executor.process_setup import ExitState, ProcessBoot, prepare_process
from executor.protocol import (
    ALL_RANKS,
    EXIT_CAUSE,
    EXIT_CAUSES,
    EXIT_QUEUE_CORRUPTED,
    EXIT_STARTUP_FAILED,
    FATAL,
    REPLY_ERROR,
    REPLY_OK,
    RemoteError,
    method_name,
    span_name,
)
from executor.serialization import decode, encode, peek, trace_context
from executor.shm import SegmentFd
from executor.shm_queue import QueueReader, QueueSpec, QueueWriter, ShmRingBuffer
from executor.transport import MessageReader, MessageWriter
from executor.waiting import Doorbell, WaitPolicy
from executor.worker_base import WorkerContext

log = logging.getLogger("executor.worker")


@dataclasses.dataclass(kw_only=True)
class WorkerBootstrap:
    """Everything a worker process is started with (pickled for spawn and forkserver)."""

    ctx: WorkerContext
    worker: str  # "module:Class"
    rpc: QueueSpec
    rpc_fd: SegmentFd  # the rpc ring's memory (created by the driver; we attach)
    rpc_bell: Connection  # read end: the driver rings it when a request chunk is published
    rpc_writer_bell: Connection  # write end: ring the driver when we free a request chunk
    reply: QueueSpec
    reply_fd: SegmentFd  # this worker's reply ring (created by the driver; we attach)
    reply_bell: Connection  # write end: ring the driver when a reply chunk is published
    reply_writer_bell: Connection  # read end: the driver rings it when it frees a reply chunk
    death: Connection  # read end of the death pipe
    ready: Connection  # write end: READY or the start-up error
    start_method: str
    thread_cap: int
    wait_policy: WaitPolicy
    exit_grace_s: float = 0.1
    trace: tuple[int, int, int] | None = None  # the driver's start-up span, for process-life events
    # The driver's environment when it started us: a forkserver child would otherwise see
    # the forkserver's, frozen when it started (FAULTLAB_*, OTEL_* set later would be lost).
    environ: dict[str, str] = dataclasses.field(default_factory=lambda: dict(os.environ))
    keep_buffers: bool = True
    driver_pid: int = dataclasses.field(default_factory=os.getpid)  # built in the driver


class _Leave(Exception):
    """The death pipe reached EOF: leave the loop and exit."""


def worker_main(boot: WorkerBootstrap) -> None:
    """Process entry point."""
    state = prepare_process(boot, lambda code: report_exit_cause(boot.ready, code))
    try:
        proc = WorkerProc(boot, state)
    except BaseException as exc:  # noqa: BLE001 - any failure must reach the driver
        _report_startup_failure(boot, exc)
        sys.exit(EXIT_STARTUP_FAILED)
    boot.ready.send(("ready", os.getpid(), boot.reply))  # kept open: report_exit_cause
    if proc.rec.enabled:
        proc.rec.event("worker.ready", {"faultlab.rank": boot.ctx.rank, "process.pid": os.getpid()},
                       telemetry.SpanContext.from_wire(boot.trace))
    proc.run()


def report_exit_cause(ready: Connection | None, code: int) -> None:
    """Tell the driver, on the READY pipe, that we are about to exit with ``code`` for its
    cause in ``EXIT_CAUSES``; the driver names no cause it was not told."""
    if ready is None:
        return
    try:
        ready.send((EXIT_CAUSE, code, EXIT_CAUSES[code]))
    except (OSError, ValueError):  # the pipe is gone (the driver too): the exit code still tells
        pass


def _report_startup_failure(boot: WorkerBootstrap, exc: BaseException) -> None:
    try:
        boot.ready.send(("error", RemoteError.capture(exc)))
    except OSError:
        pass


def _build_worker(spec: str, ctx: WorkerContext) -> Any:
    module_name, sep, class_name = spec.partition(":")
    if not sep or not module_name or not class_name:
        raise ValueError(f"worker must be 'module:Class', got {spec!r}")
    cls = getattr(importlib.import_module(module_name), class_name)
    return cls(ctx)


class WorkerProc:
    """The worker's queues, its worker object, and the serve loop."""

    def __init__(
        self, boot: ProcessBoot, state: ExitState,
        queues: tuple[MessageReader, MessageWriter] | None = None,
    ) -> None:
        self.rank = boot.ctx.rank
        self.state = state
        self.rec = telemetry.get_recorder()
        if queues is None:
            assert isinstance(boot, WorkerBootstrap)
            queues = self._shm_queues(boot)
        self.reader, self.writer = queues
        self.exit_pipe: Connection | None = getattr(boot, "ready", None)  # local workers only
        self.worker = _build_worker(boot.worker, boot.ctx)
        self._replies: queue.SimpleQueue[tuple[int, int, Any]] | None = None
        if boot.ctx.async_scheduling:
            self._replies = queue.SimpleQueue()
            threading.Thread(target=self._reply_loop, name="faultlab-replies", daemon=True).start()

    def _shm_queues(self, boot: WorkerBootstrap) -> tuple[QueueReader, QueueWriter]:
        death = [boot.death.fileno()]
        for conn in (boot.rpc_bell, boot.reply_writer_bell, boot.rpc_writer_bell, boot.reply_bell):
            os.set_blocking(conn.fileno(), False)
        self.reply_ring = ShmRingBuffer(boot.reply, boot.reply_fd)
        self.rpc_ring = ShmRingBuffer(boot.rpc, boot.rpc_fd)
        reader = QueueReader(
            self.rpc_ring, self.rank, Doorbell(boot.rpc_bell.fileno()),
            boot.rpc_writer_bell.fileno(), death, leave_loop, boot.wait_policy,
        )
        writer = QueueWriter(
            self.reply_ring, [boot.reply_bell.fileno()], Doorbell(boot.reply_writer_bell.fileno()),
            death, leave_loop, boot.wait_policy,
        )
        return reader, writer

    def run(self) -> None:
        try:
            while not self.state.terminating:
                self._serve_one()
            # The handler's SystemExit was swallowed (it fired inside a finalizer, where
            # exceptions are only printed): leave all the same, as the signal asked.
            raise SystemExit(128 + self.state.terminating)
        except _Leave:
            pass
        finally:
            self.state.exiting = True
            self._close()

    def _close(self) -> None:
        close = getattr(self.worker, "close", None)
        if close is not None:
            try:
                close()
            except Exception:
                log.exception("worker %d: close() failed", self.rank)
        telemetry.shutdown()

    def _serve_one(self) -> None:
        waited = time.time_ns()
        try:
            try:
                got = self.reader.read(None)
            except CorruptMessageError as exc:
                self._send(getattr(exc, "msg_id", 0), REPLY_ERROR, RemoteError.capture(exc))
                return
            if got is not None:
                self._handle(got[0], got[1], waited, time.time_ns())
        except QueueCorruptedError as exc:  # either queue: a ring out of sync is never trusted
            self._send_fatal(exc)
            report_exit_cause(self.exit_pipe, EXIT_QUEUE_CORRUPTED)
            raise SystemExit(EXIT_QUEUE_CORRUPTED) from exc

    def _handle(self, msg_id: int, frame: bytes | bytearray, waited_ns: int, got_ns: int) -> None:
        _kind, reply_rank = peek(frame)
        must_reply = reply_rank in (ALL_RANKS, self.rank)
        if failpoints.ACTIVE:
            failpoints.fire("worker.after_dequeue", rank=self.rank, msg_id=msg_id)
        try:
            if failpoints.ACTIVE:
                failpoints.fire("worker.before_unpickle", rank=self.rank, msg_id=msg_id)
            method, args, kwargs = decode(frame)
        except BaseException as exc:  # noqa: BLE001 - a bad request must not end the worker
            self._reraise_if_terminating(exc)
            if must_reply:
                self._send(msg_id, REPLY_ERROR, _annotated(exc, "could not unpickle the request"))
            return
        span_id = start_ns = 0
        if self.rec.enabled:
            hi, lo, parent, flags = trace_context(frame)
            if parent:  # a traced RPC: its context rides in the frame header
                # The execute span: its start record now, so a worker that dies in its
                # method or before its reply is out leaves it open, truncated; one record
                # once the reply is out ends it and carries the dequeue and reply-enqueue
                # times (worker.dequeue / worker.reply_enqueue when read).  Plain ints, no
                # span object: every traced RPC runs this (telemetry.rpc_trace).  Rank and
                # pid are the journal's, the rpc id is the parent's.
                name = _EXECUTE_NAMES.get(method) if type(method) is str else None
                if name is None:
                    name = span_name(_EXECUTE_NAMES, "worker.execute ", method)
                start_ns = _time_ns()
                span_id = self.rec.serve(name, hi, lo, parent, flags, start_ns)
        kind, value = self._execute(msg_id, method, args, kwargs)
        if not span_id:
            if must_reply:
                self._reply(msg_id, kind, value)
            return
        executed_ns = _time_ns()
        if must_reply:
            self._reply(msg_id, kind, value)
        self.state.deferring = True  # the reply is out: its span's end record goes first
        try:
            self.rec.served(span_id, waited_ns, got_ns, start_ns, executed_ns,
                            executed_ns if must_reply else 0, value if kind == REPLY_ERROR else None)
        finally:
            self.state.deferring = False
        self.state.take_deferred()

    def _execute(self, msg_id: int, method: Any, args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> tuple[int, Any]:
        try:
            if failpoints.ACTIVE:
                failpoints.fire("worker.before_execute", rank=self.rank, msg_id=msg_id,
                                method=method_name(method))
            if isinstance(method, str):
                result = _lookup(self.worker, method)(*args, **kwargs)
            else:
                result = method(self.worker, *args, **kwargs)
            if failpoints.ACTIVE:
                failpoints.fire("worker.after_execute", rank=self.rank, msg_id=msg_id,
                                method=method_name(method))
        except BaseException as exc:  # noqa: BLE001 - sys.exit in a method is an error reply
            self._reraise_if_terminating(exc)
            return REPLY_ERROR, RemoteError.capture(exc)
        return REPLY_OK, result

    def _reraise_if_terminating(self, exc: BaseException) -> None:
        if isinstance(exc, (SystemExit, KeyboardInterrupt, _Leave)) and (
            self.state.terminating or isinstance(exc, _Leave)
        ):
            raise exc

    def _reply(self, msg_id: int, kind: int, value: Any) -> None:
        if self._replies is not None:
            self._replies.put((msg_id, kind, value))
        else:
            self._send(msg_id, kind, value)

    def _reply_loop(self) -> None:
        """Async scheduling: replies leave from this thread.  What would end a sync worker's
        serve loop ends the process here too (a thread's exit alone would leave the driver
        waiting for replies that never come); the journal is crash-safe, so os._exit loses
        no span."""
        assert self._replies is not None
        while True:
            msg_id, kind, value = self._replies.get()
            try:
                self._send(msg_id, kind, value)
            except (_Leave, SystemExit):
                return  # the death pipe's EOF or a signal: the main thread leaves too
            except QueueCorruptedError as exc:
                self._send_fatal(exc)
                report_exit_cause(self.exit_pipe, EXIT_QUEUE_CORRUPTED)
                os._exit(EXIT_QUEUE_CORRUPTED)
            except BaseException:  # as an uncaught error ends a sync worker
                log.exception("worker %d: sending the reply to message %d failed", self.rank, msg_id)
                os._exit(1)

    def _send(self, msg_id: int, kind: int, value: Any) -> None:
        try:
            if failpoints.ACTIVE:
                failpoints.fire("worker.before_pickle_reply", rank=self.rank, msg_id=msg_id)
            parts = encode(kind, self.rank, value)
        except BaseException as exc:  # noqa: BLE001 - an unpicklable result is an error reply
            self._reraise_if_terminating(exc)
            parts = encode(REPLY_ERROR, self.rank, _annotated(exc, "could not pickle the reply"))
        if failpoints.ACTIVE:
            failpoints.fire("worker.before_reply", rank=self.rank, msg_id=msg_id)
        self.writer.write(msg_id, parts, None)
        if failpoints.ACTIVE:
            failpoints.fire("worker.after_reply", rank=self.rank, msg_id=msg_id)

    def _send_fatal(self, exc: BaseException) -> None:
        try:
            self.writer.write(0, encode(FATAL, self.rank, RemoteError.capture(exc)), time.monotonic() + 1)
        except Exception:  # noqa: BLE001 - the exit code still tells the driver
            pass


def _lookup(worker: Any, name: str) -> Any:
    try:
        return getattr(worker, name)
    except AttributeError:
        raise AttributeError(
            f"{type(worker).__qualname__} has no method {name!r} (rank {worker.rank})"
            if hasattr(worker, "rank")
            else f"{type(worker).__qualname__} has no method {name!r}"
        ) from None


def _annotated(exc: BaseException, what: str) -> RemoteError:
    remote = RemoteError.capture(exc)
    return remote._replace(message=f"{what}: {remote.message}")


_time_ns = time.time_ns
_EXECUTE_NAMES: dict[str, str] = {}  # method name -> execute span name, made once per name


def leave_loop() -> None:
    """An ``on_interrupt`` for queue ends: the death pipe fired, leave the serve loop."""
    raise _Leave
