"""``MultiprocExecutor``: one driver broadcasting calls to N worker processes.

    caller ── collective_rpc ──► pickle ──► rpc queue (shm ring, 1 writer, N readers) ──► workers
       ▲                                                                                   │
       └── future / result ◄── ReplyCollector ◄── reply queue r (shm ring, 1 reader) ◄─────┘
    monitor thread: waits on worker sentinels ──► _fail() ──► cancel pipe wakes every waiter
    death pipe: only the driver holds the write end; closing it (or dying) tells workers to go
    nnodes > 1: requests also go to the other nodes' workers through ``RemoteNodes``
    (executor/remote_nodes.py, imported only then: a TCP hub thread); their replies come back
    through it; a lost node fails us
    executor/lifecycle.py (shared with RayExecutor): the failure state machine, the failure
    callbacks, the restart swap and the call path; this module: the shm queues and processes

Invariants:
- ``_send_lock`` orders request ids, the rpc queue and the pending deque identically; a call
  enters ``pending`` only once its request is fully in the queue.
- After ``_fail`` the executor never serves again: the cancel pipe stays readable, every
  wait on a queue raises ``ExecutorFailedError`` at once, the workers are stopped, and the
  failure callbacks run once — whatever failed it (worker death, node loss, queue damage,
  a protocol error).  They run on a thread that holds none of our locks.
- The executor belongs to the process that created it: in a forked child every method
  raises ``ForeignProcessError`` and ``shutdown``/the finalizer do nothing, so nothing a
  child does reaches the parent's workers or queues.
- Futures are settled only after the thread releases ``_send_lock`` and the collector's
  lock (``ReplyCollector.settle_resolved``): their done-callbacks may call the executor.
- ``ExecutorResources.shutdown`` (executor/resources.py) is idempotent and owns every OS
  resource (processes, pipes, mappings); it runs from ``shutdown()``, from the failure path,
  at garbage collection and at interpreter exit (``weakref.finalize``).  It never needs the
  executor object itself.
"""

from __future__ import annotations

import os
import time
import weakref
from collections.abc import Callable
from typing import Any

import telemetry
from executor import failpoints, shm
from executor.calls import PendingCall, ReplyCollector, drop_locals
from executor.config import ExecutorConfig
from executor.errors import ExecutorFailedError, QueueCorruptedError
from executor.fd_room import ensure_fd_room
from executor.launch import distributed_init_method, start_workers, wait_ready
from executor.lifecycle import ExecutorLifecycle
from executor.monitor import WorkerMonitor
from executor.remote_site import RemoteSite, release
from executor.resources import ExecutorResources
from executor.shm_queue import QueueReader, QueueSpec, QueueWriter, ShmRingBuffer
from executor.transport import BroadcastWriter, MessageReader, MessageWriter
from executor.waiting import DEFAULT_POLICY, Doorbell, WaitPolicy, Warmth
from telemetry import rpc_trace
from telemetry.rpc_trace import RpcTrace


class MultiprocExecutor(ExecutorLifecycle):
    """Runs ``cfg.world_size`` worker processes and broadcasts calls to them."""

    def __init__(self, cfg: ExecutorConfig, *, wait_policy: WaitPolicy = DEFAULT_POLICY) -> None:
        if not isinstance(cfg, ExecutorConfig):
            raise TypeError(f"cfg must be an ExecutorConfig, got {type(cfg).__name__}")
        shm.sweep_stale()
        self._init_lifecycle(cfg)
        self._res = ExecutorResources(cfg)
        self._site = RemoteSite()  # nnodes > 1: the hub the remote agents keep across incarnations
        self._finalizer = weakref.finalize(self, release, self._res, self._site)
        self._send_lock = self._res.send_lock
        self._rec = self._res.rec
        self._wait_policy = wait_policy  # every incarnation's queues wait the same way
        self._workers_woken = Warmth()  # the rpc writer rang a worker: reply waits block at once
        try:
            self._start(wait_policy)
        except BaseException:
            self._finalizer()
            raise

    # ------------------------------------------------------------------ start-up

    def _start(self, policy: WaitPolicy, startup_timeout: float | None = None) -> None:
        """Start this incarnation's workers; READY from all within ``startup_timeout`` (the
        config's, or less: what is left of a restart's own deadline)."""
        cfg, res = self.config, self._res
        timeout = cfg.startup_timeout if startup_timeout is None else min(startup_timeout,
                                                                            cfg.startup_timeout)
        ensure_fd_room(cfg.local_world_size)
        rpc_ring = ShmRingBuffer(QueueSpec("rpc", cfg.local_world_size, cfg.n_chunks,
                                           cfg.chunk_bytes, cfg.checksum))
        res.rings.append(rpc_ring)
        for r in range(cfg.local_world_size):  # every ring exists before any worker starts
            res.rings.append(ShmRingBuffer(QueueSpec(f"reply{r}", 1, cfg.n_chunks,
                                                     cfg.chunk_bytes, cfg.checksum)))
        span = self._rec.start_span("executor.startup", telemetry.caller_parent(), {
            "faultlab.world_size": cfg.world_size, "faultlab.worker": cfg.worker,
        }) if self._rec.enabled else None
        trace = telemetry.SpanContext.to_wire(span.context) if span is not None else None
        init_method = distributed_init_method(cfg)
        if cfg.nnodes > 1:
            from executor.remote_nodes import RemoteNodes  # loads pyzmq: multi-node only

            res.remote = RemoteNodes.start(cfg, init_method, policy, trace, self._site)
        deadline = time.monotonic() + timeout
        res.handles, res.wiring = start_workers(cfg, rpc_ring, res.rings[1:], policy, trace,
                                                init_method)
        try:
            wait_ready(res.handles, timeout, self._rec,
                       span.context if span is not None else None)
            if res.remote is not None:
                res.remote.wait_ready(deadline, timeout)
        except BaseException as exc:  # even sys.exit in a __reduce__ fails this call only
            if span is not None:
                span.end(exc)
            raise
        shm_writer = QueueWriter(
            rpc_ring, [h.rpc_bell.fileno() for h in res.handles],
            Doorbell(res.wiring.rpc_writer_bell.fileno()), [res.cancel_r], self._raise_failure, policy,
            relieve=self._relieve, woke=self._workers_woken,
        )
        self._writer: MessageWriter = shm_writer
        readers: list[MessageReader] = list(self._attach_replies(policy))
        if res.remote is not None:
            self._writer = BroadcastWriter([shm_writer, res.remote.writer()])
            readers += res.remote.readers([res.cancel_r], self._raise_failure)
        self._collector = ReplyCollector(
            readers, res.reply_lock, lambda: self._failure, self._fail, self._call_resolved, self._rec,
        )
        res.monitor = WorkerMonitor(
            [(h.rank, h.process, h.sentinel) for h in res.handles], self._death_callback()
        )
        res.monitor.start()
        if res.remote is not None:  # from now on a lost node fails us (before, start-up)
            res.remote.serve(self._on_node_lost)
        if span is not None:
            span.set_attribute("faultlab.worker_pids", str(self.worker_pids))
            span.end()

    def _attach_replies(self, policy: WaitPolicy) -> list[QueueReader]:
        readers = []
        for h in self._res.handles:
            ring = h.reply_ring
            os.set_blocking(h.reply_bell.fileno(), False)
            readers.append(QueueReader(
                ring, 0, Doorbell(h.reply_bell.fileno()), h.reply_writer_bell.fileno(),
                [self._res.cancel_r], self._raise_failure, policy, peers=self._workers_woken,
            ))
        return readers

    # ------------------------------------------------------------------ public API

    @property
    def worker_pids(self) -> list[int]:
        pids = [h.pid for h in self._res.handles]
        if self._res.remote is not None:
            pids += self._res.remote.pids()
        return pids

    @property
    def driver_address(self) -> str | None:
        """"HOST:PORT" that remote workers connect to (None when nnodes is 1)."""
        return self._res.remote.address if self._res.remote is not None else None

    @property
    def secret_file(self) -> str | None:
        """The file holding the TCP secret (None: one node, or from $FAULTLAB_SECRET)."""
        return self._res.remote.secret_file if self._res.remote is not None else None

    @property
    def rejected_messages(self) -> int:
        """How many TCP messages failed authentication and were dropped unread."""
        return self._res.remote.rejected if self._res.remote is not None else 0

    @property
    def stale_messages(self) -> int:
        """How many authentic TCP messages of an older incarnation were dropped undelivered."""
        return self._res.remote.stale if self._res.remote is not None else 0

    @property
    def is_failed(self) -> bool:
        return self._failure is not None

    @property
    def world_size(self) -> int:
        return self.config.world_size

    def caller_locks(self) -> dict[str, Any]:
        """The locks a caller's thread may take inside this executor, by name: for checks
        that none is ever left held (chaos.interrupt_sweep: Ctrl-C at every point)."""
        res = self._res
        locks = {"send_lock": res.send_lock, "reply_lock": res.reply_lock,
                 "state_lock": self._state_lock, "restart_lock": self.restart_lock,
                 "resources.lock": res.lock}
        collector = getattr(self, "_collector", None)
        if collector is not None:
            locks["resolve_lock"] = collector.resolve_lock
            locks["settle_lock"] = collector.settle_lock
        return locks

    def check_health(self) -> None:
        """Raise ExecutorFailedError if the executor failed or any worker is gone."""
        self._check_owner()
        self._raise_failure()
        remote = self._res.remote
        if remote is not None and remote.lost is not None:
            raise ExecutorFailedError(remote.lost)
        for h in self._res.handles:  # the pidfd's word: exitcode is None forever once reaped elsewhere
            end = h.ended()
            if end is not None:
                raise ExecutorFailedError(h.describe_end(end.code), rank=h.rank, pid=h.pid,
                                          exitcode=end.code)

    def shutdown(self) -> None:
        """Stop every worker (grace, SIGTERM, SIGKILL) and release everything; idempotent.

        In a forked child it does nothing: the workers belong to the parent."""
        if not self._res.owned():
            return
        self._close()
        self._res.cancel()
        self._finalizer()
        self._fail_pending()
        collector = getattr(self, "_collector", None)
        if collector is not None:
            collector.settle_resolved()  # every future is done when shutdown() returns
        self._join_failure_thread()

    # ------------------------------------------------------------------ incarnations
    # The restart protocol (executor/lifecycle.py has the rest): callers hold ``restart_lock``.

    def start_incarnation(self, startup_timeout: float) -> None:
        """Fresh resources, READY from every rank within ``startup_timeout``, then the swap;
        a failed start shuts its own resources down (nothing leaks) and raises."""
        old = self._res
        res = ExecutorResources(self.config)
        res.send_lock, res.reply_lock = old.send_lock, old.reply_lock
        self._res = res  # self._failure is still set: callers keep failing at once
        self._finalizer.detach()
        self._finalizer = weakref.finalize(self, release, res, self._site)
        try:
            self._start(self._wait_policy, startup_timeout)
            if failpoints.ACTIVE:  # chaos: a new worker dying between READY and the swap
                failpoints.fire("driver.before_go_live", resources=res,
                                incarnation=self.incarnation + 1)
            self._go_live(res)
        except BaseException:
            res.shutdown()
            raise
        self._report_early_death(res)

    def _go_live(self, res: ExecutorResources) -> None:
        """Swap in the new incarnation (a chaos test wraps this step)."""
        self._swap_in(res.send_lock, res.reply_lock)

    def _report_early_death(self, res: ExecutorResources) -> None:
        """A worker that died before the swap: its monitor's report found us failed.  Its
        pidfd says so (``h.ended()``), not multiprocessing's exitcode: that stays None
        forever once another handler reaped the worker (a caller that ignores SIGCHLD)."""
        for h in res.handles:
            end = h.ended()
            if end is not None:
                self._on_worker_death(h.rank, h.pid, end.code, time.time_ns())
                raise ExecutorFailedError(f"worker rank {h.rank} of the new incarnation died "
                                          "during the restart")

    # ------------------------------------------------------------------ calls

    def _owned(self) -> bool:
        return self._res.owned()

    def _owner_pid(self) -> int:
        return self._res.owner_pid

    def _send_request(self, call: PendingCall, parts: list[Any], trace: RpcTrace | None) -> None:
        start_ns = time.time_ns() if trace is not None else 0
        deadline = min(call.deadline, time.monotonic() + self.config.enqueue_timeout)
        try:
            if failpoints.ACTIVE:
                failpoints.fire("driver.before_enqueue", msg_id=call.rpc_id, method=call.method)
            self._writer.write(call.rpc_id, parts, deadline)
            if failpoints.ACTIVE:
                failpoints.fire("driver.after_enqueue", msg_id=call.rpc_id, method=call.method)
        except QueueCorruptedError as exc:
            drop_locals(exc.__traceback__)
            failure = ExecutorFailedError(f"request queue damaged: {exc}")
            self._fail(failure)
            if trace is not None:
                self._end_trace(call, trace, failure)
            raise failure from exc
        except BaseException as exc:  # even sys.exit in a __reduce__ fails this call only
            drop_locals(exc.__traceback__)  # the writer's frames may hold slices of the ring
            if trace is not None:
                rpc_trace.enqueue_failed(self._rec, trace, start_ns, exc)
                self._end_trace(call, trace, exc)
            raise
        if trace is not None:  # the enqueue span and the body size (rpc_trace's items 2-4)
            trace += (start_ns, time.time_ns(), sum(map(len, parts)))

    def _relieve(self) -> bool:
        """The rpc queue is full: collect the replies that are there (see shm_queue)."""
        return self._collector.collect_available()

    # ------------------------------------------------------------------ failure

    def _death_callback(self) -> Callable[[int, int, int | None, int], None]:
        """A callback for the monitor thread that does not keep the executor alive."""
        method = weakref.WeakMethod(self._on_worker_death)

        def on_death(rank: int, pid: int, exitcode: int | None, detected_ns: int) -> None:
            bound = method()
            if bound is not None:
                bound(rank, pid, exitcode, detected_ns)

        return on_death

    def _on_worker_death(self, rank: int, pid: int, exitcode: int | None, detected_ns: int) -> None:
        handle = next((h for h in self._res.handles if h.pid == pid), None)
        if handle is None:
            return  # a worker of an earlier incarnation: that one has been failed already
        error = ExecutorFailedError(  # exitcode None: it ended, reaped by another handler
            f"{handle.describe_end(exitcode)}; the executor has shut down and every pending "
            "call failed", rank=rank, pid=pid, exitcode=exitcode,
        )
        if self._rec.enabled:
            self._rec.event("executor.worker_death", {
                "faultlab.rank": rank, "process.pid": pid,
                "process.exit.code": -1 if exitcode is None else exitcode,
                "faultlab.detected_ns": detected_ns,
            })
        self._fail(error, inline=True)  # the monitor thread holds no lock: clean up right here

    def _on_node_lost(self, node: int, ranks: list[int], why: str) -> None:
        error = ExecutorFailedError(f"{why}; the executor has shut down and every pending call failed",
                                    node=node, ranks=ranks)
        if self._rec.enabled:
            self._rec.event("executor.node_lost", {"faultlab.node": node, "faultlab.ranks": str(ranks),
                                                   "faultlab.detected_ns": time.time_ns()})
        self._fail(error, inline=True)

    def _wake_waiters(self) -> None:
        self._res.cancel()

    def _stop_workers(self) -> None:
        self._res.shutdown()
