"""Starting the worker processes and waiting for READY.

    driver                                   worker rank r
    create rpc ring, reply rings, pipes      attach rpc ring and its reply ring (fds in
      ──start──►                               its bootstrap), build the worker class
    close the ring fds                         (loads the model)
    wait(READY pipes + sentinels) ◄──────    send ("ready", pid, reply spec) | ("error", RemoteError)
    read the reply rings                     serve
    keep the READY pipe ◄──────────────────  send ("exit", code, cause) just before exiting for
                                               a cause of its own (protocol.EXIT_CAUSES)

Invariants:
- The driver creates every ring (anonymous memory, executor/shm.py) before any process
  starts; workers only attach, so nothing of a start-up is ever named in /dev/shm.
- The driver closes its copies of the child-side pipe ends and its ring fds once every
  worker has started (the mappings keep the memory); only the driver keeps the death
  pipe's write end.
- A worker that dies or reports an error before READY makes ``launch`` raise
  ``WorkerStartupError`` carrying the worker's own traceback, after stopping the others.
- An exit code is given a cause only when the worker itself sent that cause (its READY
  pipe stays open for it: a small message outlives the writer), never from the number alone.
- Whether a worker lives, and how it ended, is its pidfd's word (``WorkerHandle.ended``,
  executor/exits.py), whoever reaps the driver's children.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import socket
import threading
import time
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any

from executor import death_pipes, exits
from executor.config import ExecutorConfig
from executor.errors import WorkerStartupError
from executor.protocol import EXIT_CAUSE, RemoteError, describe_exit
from executor.shm_queue import ShmRingBuffer
from executor.waiting import WaitPolicy
from executor.worker_base import WorkerContext
from executor.worker_proc import WorkerBootstrap, worker_main


@dataclasses.dataclass
class WorkerHandle:
    """The driver's view of one worker: its process and the driver-side pipe ends."""

    rank: int
    process: BaseProcess
    reply_ring: ShmRingBuffer  # created by the driver; this worker attaches to it
    rpc_bell: Connection  # write end: wake this worker when a request chunk is published
    reply_bell: Connection  # read end: this worker rings it when it publishes a reply chunk
    reply_writer_bell: Connection  # write end: wake this worker when we free a reply chunk
    ready: Connection  # read end of its READY pipe; after READY, its exit cause (if any)
    pid: int = 0
    # Readable once the process has exited: a pidfd where the kernel has them.  Not the
    # multiprocessing sentinel, a pipe that a worker's own children inherit and so keep
    # "alive" after the worker died.  Closed by ExecutorResources once the process is reaped.
    exit_fd: int = -1
    # (exit code, cause) the worker sent before exiting; read once from ``ready``, () if none.
    reported_exit: tuple[int, str] | tuple[()] | None = None
    end: exits.Ended | None = None  # how it ended, once known (kept after the process is closed)
    # Guards exit_fd (never polled once closed: the number may be reused), end and reported_exit.
    _lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, repr=False)

    @property
    def sentinel(self) -> int:
        return self.exit_fd if self.exit_fd >= 0 else self.process.sentinel

    def ended(self) -> exits.Ended | None:
        """None while the worker runs; else how it ended (from its pidfd; reaps it)."""
        with self._lock:
            return self._ended()

    def _ended(self) -> exits.Ended | None:
        if self.end is None:
            self.end = exits.ended(self.process, self.exit_fd)
        return self.end

    def release(self) -> bool:
        """Close the process and its pidfd once it has ended; False (nothing closed) while it runs."""
        with self._lock:
            if self.end is None and self._ended() is None:
                return False
            if self.reported_exit is None:  # read before the READY pipe is closed with the rest
                self.reported_exit = _read_cause(self.ready)
            if not exits.release(self.process, self.exit_fd):
                return False
            fd, self.exit_fd = self.exit_fd, -1
        if fd >= 0:
            os.close(fd)
        return True

    def describe_end(self, code: int | None) -> str:
        """'worker rank r (pid p) <how it ended>', naming a cause only if the worker sent one."""
        return f"worker rank {self.rank} (pid {self.pid}) {describe_exit(code, self.exit_cause(code))}"

    def exit_cause(self, code: int | None) -> str | None:
        """The cause the worker sent before exiting with ``code`` (None: it sent none)."""
        with self._lock:
            if self.reported_exit is None:
                self.reported_exit = _read_cause(self.ready)
            reported = self.reported_exit
        if not reported:
            return None
        sent_code, cause = reported
        return cause if code is None or code == sent_code else None

    def close_exit_fd(self) -> None:
        with self._lock:
            fd, self.exit_fd = self.exit_fd, -1
        if fd >= 0:
            os.close(fd)


def _read_cause(ready: Connection) -> tuple[int, str] | tuple[()]:
    """(code, cause) from an ("exit", code, cause) message waiting in the READY pipe, or ()."""
    try:
        if ready.closed or not ready.poll(0):
            return ()
        message = ready.recv()
    except (OSError, EOFError):
        return ()
    if isinstance(message, tuple) and len(message) == 3 and message[0] == EXIT_CAUSE:
        return int(message[1]), str(message[2])
    return ()


def open_exit_fd(pid: int | None) -> int:
    """A pidfd for ``pid`` (Linux 5.3+), or -1 where there is none: fall back to the sentinel."""
    if pid is None or not hasattr(os, "pidfd_open"):
        return -1
    try:
        return os.pidfd_open(pid)
    except OSError:
        return -1


@dataclasses.dataclass
class Wiring:
    """Driver-side ends shared by all workers."""

    rpc_writer_bell: Connection  # read end: workers ring it when they free a request chunk
    death: Connection  # write end of the death pipe; closing it tells every worker to leave
    child_ends: list[Connection]  # closed by the driver once every worker has started


def free_port(host: str) -> int:
    """A TCP port free on ``host`` right now (bound, read, released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def free_loopback_port() -> int:
    return free_port("127.0.0.1")


def make_context(start_method: str) -> multiprocessing.context.BaseContext:
    ctx = multiprocessing.get_context(start_method)
    if start_method == "forkserver":
        ctx.set_forkserver_preload(["executor.worker_proc"])
    return ctx


def distributed_init_method(cfg: ExecutorConfig) -> str:
    """torch.distributed's rendezvous, on the driver's address (loopback unless told otherwise)."""
    host = "127.0.0.1" if cfg.nnodes == 1 else cfg.driver_host
    return f"tcp://{host}:{free_port(host)}"


def start_workers(
    cfg: ExecutorConfig, rpc_ring: ShmRingBuffer, reply_rings: list[ShmRingBuffer],
    policy: WaitPolicy, trace: tuple[int, int, int] | None = None, init_method: str | None = None,
) -> tuple[list[WorkerHandle], Wiring]:
    """Start the worker processes of this node, ranks 0 .. local_world_size - 1 (not yet READY)."""
    method = cfg.resolved_start_method()
    ctx = make_context(method)
    rpc_writer_r, rpc_writer_w = ctx.Pipe(duplex=False)
    death_r, death_w = ctx.Pipe(duplex=False)
    death_pipes.register(death_w.fileno())
    wiring = Wiring(rpc_writer_r, death_w, [rpc_writer_w, death_r])
    if init_method is None:
        init_method = distributed_init_method(cfg)
    handles = []
    for rank in range(cfg.local_world_size):
        wctx = WorkerContext(
            rank, cfg.world_size, cfg.tensor_parallel_size, cfg.pipeline_parallel_size,
            init_method, dict(cfg.worker_kwargs), cfg.async_scheduling,
        )
        handles.append(_start_one(
            ctx, cfg, wctx, rpc_ring, reply_rings[rank], policy, wiring, method, trace
        ))
    for conn in wiring.child_ends:
        conn.close()
    for ring in (rpc_ring, *reply_rings):
        ring.segment.close_fd()  # every worker has its own fd or mapping now
    return handles, wiring


def _start_one(
    ctx: multiprocessing.context.BaseContext, cfg: ExecutorConfig, wctx: WorkerContext,
    rpc_ring: ShmRingBuffer, reply_ring: ShmRingBuffer, policy: WaitPolicy, wiring: Wiring,
    method: str, trace: tuple[int, int, int] | None,
) -> WorkerHandle:
    rpc_bell_r, rpc_bell_w = ctx.Pipe(duplex=False)
    reply_bell_r, reply_bell_w = ctx.Pipe(duplex=False)
    reply_writer_r, reply_writer_w = ctx.Pipe(duplex=False)
    ready_r, ready_w = ctx.Pipe(duplex=False)
    boot = WorkerBootstrap(
        ctx=wctx, worker=cfg.worker,
        rpc=rpc_ring.spec, rpc_fd=rpc_ring.segment.handle(),
        rpc_bell=rpc_bell_r, rpc_writer_bell=wiring.child_ends[0],
        reply=reply_ring.spec, reply_fd=reply_ring.segment.handle(),
        reply_bell=reply_bell_w, reply_writer_bell=reply_writer_r,
        death=wiring.child_ends[1], ready=ready_w, start_method=method,
        thread_cap=cfg.thread_cap(), wait_policy=policy, exit_grace_s=cfg.worker_exit_grace,
        trace=trace, keep_buffers=cfg.worker_keep_buffers,
    )
    process = ctx.Process(  # type: ignore[attr-defined]
        target=worker_main, args=(boot,), name=f"faultlab-worker-{wctx.rank}", daemon=True
    )
    process.start()
    _untrack(process)
    for conn in (rpc_bell_r, reply_bell_w, reply_writer_r, ready_w):
        conn.close()
    for conn in (rpc_bell_w, reply_bell_r, reply_writer_w):
        os.set_blocking(conn.fileno(), False)
    return WorkerHandle(
        wctx.rank, process, reply_ring, rpc_bell_w, reply_bell_r, reply_writer_w, ready_r,
        process.pid or 0, open_exit_fd(process.pid),
    )


def _untrack(process: BaseProcess) -> None:
    """Take a worker off multiprocessing's list of children: the executor stops and reaps its
    workers itself.  multiprocessing's exit handler SIGTERMs every daemon child on that list,
    which killed the workers before the executor's own shutdown when that handler ran first
    (a script whose first weakref.finalize predates importing multiprocessing), and ran in
    every os.fork() child that simply exited, killing the *parent's* workers."""
    multiprocessing.process._children.discard(process)  # type: ignore[attr-defined]


def wait_ready(
    handles: list[WorkerHandle], timeout: float, rec: Any = None, parent: Any = None
) -> None:
    """Block until every worker said READY; raise WorkerStartupError otherwise."""
    started = time.monotonic()
    deadline = started + timeout
    waiting = {h.ready: h for h in handles}
    by_sentinel = {h.sentinel: h for h in handles}
    while waiting:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            ranks = sorted(h.rank for h in waiting.values())
            raise WorkerStartupError(
                f"worker(s) {ranks} did not report READY within {timeout:g} s "
                "(raise ExecutorConfig.startup_timeout if loading is slow)"
            )
        for obj in wait([*waiting, *by_sentinel], remaining):
            if obj in waiting:
                handle = waiting.pop(obj)
                _take_ready(handle)
                if rec is not None and rec.enabled:
                    rec.event("executor.worker_ready", {
                        "faultlab.rank": handle.rank, "process.pid": handle.pid,
                        "faultlab.startup_ms": (time.monotonic() - started) * 1e3}, parent)
            elif by_sentinel[obj].ready in waiting:  # type: ignore[index]
                _died_before_ready(by_sentinel[obj])  # type: ignore[index]


def _take_ready(handle: WorkerHandle) -> None:
    try:
        message = handle.ready.recv()
    except EOFError:
        _raise_died(handle)
    if message[0] == "error":
        error: RemoteError = message[1]
        raise WorkerStartupError(
            f"worker rank {handle.rank} (pid {handle.pid}) failed to start: "
            f"{error.type_name}: {error.message}\n\nWorker traceback:\n{error.traceback}"
        )
    handle.pid = message[1]  # the READY pipe stays open: the worker's exit cause may follow


def _died_before_ready(handle: WorkerHandle) -> None:
    if handle.ready.poll():
        _take_ready(handle)  # it managed to send its error before dying
    _raise_died(handle)


def _raise_died(handle: WorkerHandle) -> None:
    end = handle.ended()  # its pidfd fired or its READY pipe hit EOF: it ended, or is ending
    deadline = time.monotonic() + 1.0
    while end is None and time.monotonic() < deadline:
        exits.wait_ended([(handle.process, handle.exit_fd)], deadline - time.monotonic())
        end = handle.ended()
    how = "is still running" if end is None else describe_exit(end.code)
    raise WorkerStartupError(f"worker rank {handle.rank} (pid {handle.pid}) {how} before reporting READY")
