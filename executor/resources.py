"""Every OS resource of one executor, and the one idempotent way to release them.

    MultiprocExecutor ──owns──► ExecutorResources: worker processes, pipes, shm mappings,
                                the monitor thread, the remote nodes' hub (nnodes > 1), the
                                cancel pipe
    shutdown(): death pipe closed ─► stop_processes (grace, SIGTERM, SIGKILL) ─► join the
                monitor ─► close queues (mappings, ring fds) and pipes (under both queue locks)

Invariants:
- ``shutdown`` runs once (later callers wait for it) and never needs the executor object,
  so ``weakref.finalize`` can run it at garbage collection and interpreter exit.
- Memory and fds go only while ``send_lock`` and ``reply_lock`` are held: no thread is then
  inside a queue wait that could touch them.
- ``cancel()`` never writes to a closed (and possibly recycled) fd number.
- Every process's sentinel and pidfd are closed once it has ended, whoever reaped it (the
  caller's SIGCHLD disposition or handler included: executor/exits.py).
- ``owned()`` compares with this process's pid as cached at import and refreshed in every
  fork child (``os.register_at_fork``): ``os.getpid()`` is a system call (~0.5 µs) and the
  owner check runs on every call.  A fork that bypasses CPython's fork hooks (a C library
  calling fork() and then running Python) would keep the parent's pid: CPython itself,
  multiprocessing and concurrent.futures all run the hooks.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import TYPE_CHECKING

import telemetry
from executor import death_pipes, recv_pool
from executor.config import ExecutorConfig
from executor.launch import Wiring, WorkerHandle
from executor.monitor import WorkerMonitor
from executor.shm_queue import ShmRingBuffer
from executor.stopping import stop_processes
from executor.wakeup import WakeupPipe

if TYPE_CHECKING:  # pyzmq is loaded only when nnodes > 1 (executor/remote_nodes.py)
    from executor.remote_nodes import RemoteNodes

log = logging.getLogger("executor")

_this_pid = [os.getpid()]  # [0]: this process's pid, kept current across forks


def _forked() -> None:
    _this_pid[0] = os.getpid()


os.register_at_fork(after_in_child=_forked)


class ExecutorResources:
    """Every OS resource of one executor, and the one idempotent way to release them."""

    def __init__(self, cfg: ExecutorConfig) -> None:
        self.cfg = cfg
        self.rings: list[ShmRingBuffer] = []
        self.handles: list[WorkerHandle] = []
        self.wiring: Wiring | None = None
        self.monitor: WorkerMonitor | None = None
        self.remote: RemoteNodes | None = None  # nnodes > 1 only
        # Written once at failure or shutdown and never drained: every later wait wakes at once.
        self.cancel_pipe = WakeupPipe()
        self.cancel_r = self.cancel_pipe.r
        self.lock = threading.Lock()
        # Held by whoever writes the rpc queue / reads reply queues.  Releasing memory and
        # fds takes both, so no thread is inside a queue wait when they go.
        self.send_lock = threading.Lock()
        self.reply_lock = threading.RLock()  # an RLock: see "Interrupts" in executor/calls.py
        self.done = threading.Event()
        self.shutdown_started = False  # set once, under lock, by the shutdown that runs
        self.rec = telemetry.get_recorder()
        # Only the process that created the executor may touch its workers and pipes: a
        # forked child inherits this object (and its finalizer, run at the child's exit)
        # but must never signal the parent's workers or wake the parent's waiters.
        self.owner_pid = os.getpid()
        recv_pool.pool.open_user()  # closed by the shutdown that runs (and only by it)

    def owned(self) -> bool:
        return _this_pid[0] == self.owner_pid

    def cancel(self) -> None:
        """Wake every thread waiting on a queue of this executor; they find it failed."""
        if not self.owned():
            return
        self.cancel_pipe.wake()

    def shutdown(self) -> None:
        if not self.owned():
            return  # a forked child's copy: the parent's workers are not ours to stop
        with self.lock:
            if self.shutdown_started:
                first = False
            else:
                self.shutdown_started = first = True
        if not first:
            monitor = self.monitor
            if monitor is threading.current_thread():
                return  # the thread shutting down is joining this one: waiting would deadlock
            self.done.wait(self.cfg.shutdown_grace + self.cfg.sigterm_grace + 10)
            if monitor is not None:  # it may have run the shutdown: let it finish its cleanup
                monitor.join(5.0)
            return
        span = self.rec.start_span("executor.shutdown", None, {
            "faultlab.world_size": len(self.handles)}) if self.rec.enabled else None
        self._shutdown_span = span  # its own trace; the escalation steps are its events
        try:
            self._stop_workers()
            self._release()
        finally:
            recv_pool.pool.close_user()
            self.done.set()
            if span is not None:
                span.end()

    def _stop_workers(self) -> None:
        if self.monitor is not None:
            self.monitor.stop()
        self.cancel()
        if self.wiring is not None:
            death_pipes.unregister(self.wiring.death.fileno())
            self.wiring.death.close()
        if self.remote is not None:
            self.remote.stop()  # BYE to remote workers, in parallel with stopping local ones
        stop_processes(
            [(h.rank, h.process, h.exit_fd) for h in self.handles],
            self.cfg.shutdown_grace, self.cfg.sigterm_grace, self._record_step,
        )
        monitor = self.monitor
        if monitor is not None and monitor is not threading.current_thread():
            monitor.join(5.0)

    def _record_step(self, step: str, ranks: list[int]) -> None:
        log.warning("executor shutdown: %s to worker rank(s) %s", step.upper(), ranks)
        span = getattr(self, "_shutdown_span", None)
        if span is not None:
            span.add_event(f"executor.shutdown.{step}", {"faultlab.ranks": str(ranks)})

    def _release(self) -> None:
        for h in self.handles:
            _close_process(h)
        held = [lock for lock in (self.send_lock, self.reply_lock) if lock.acquire(timeout=5.0)]
        try:
            if len(held) == 2:  # else a thread is stuck inside a wait: leave the rest to GC
                self._close_queues()
        finally:
            for lock in held:
                lock.release()

    def _close_queues(self) -> None:
        for ring in self.rings:
            try:
                ring.close()
            except BufferError:
                pass  # a view of it is still referenced; the mapping goes with that object
        conns = [c for h in self.handles for c in (h.rpc_bell, h.reply_bell, h.reply_writer_bell, h.ready)]
        if self.wiring is not None:
            conns += [self.wiring.rpc_writer_bell, self.wiring.death]
        for conn in conns:
            conn.close()
        self.cancel_pipe.close()
        if self.remote is not None:
            self.remote.close()


def _close_process(handle: WorkerHandle) -> None:
    """Close the process, its sentinel and its pidfd, even when another handler reaped it
    (multiprocessing's own ``close`` then refuses: it thinks the process still runs)."""
    if not handle.release():
        log.warning("executor shutdown: worker rank %d (pid %d) outlived SIGKILL; its "
                    "pidfd stays open", handle.rank, handle.pid)


