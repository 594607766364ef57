"""``MultiprocExecutor``: one driver broadcasting calls to N worker processes.

    caller ── collective_rpc ──► pickle ──► rpc queue (shm ring, 1 writer, N readers) ──► workers
       ▲                                                                                   │
       └── future / result ◄── ReplyCollector ◄── reply queue r (shm ring, 1 reader) ◄─────┘
    monitor thread: waits on worker sentinels ──► _fail() ──► cancel pipe wakes every waiter
    death pipe: only the driver holds the write end; closing it (or dying) tells workers to go
    nnodes > 1: requests also go to the other nodes' workers through ``RemoteNodes``
    (executor/remote_nodes.py, imported only then: a TCP hub thread); their replies come back
    through it; a lost node fails us

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

import itertools
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import telemetry
from executor import failpoints, shm
from executor.call_checks import check_call, from_main
from executor.calls import PendingCall, ReplyCollector, RpcFuture, drop_locals
from executor.config import ExecutorConfig
from executor.errors import (
    ExecutorFailedError,
    ForeignProcessError,
    QueueCorruptedError,
    RequestPicklingError,
    RestartAborted,
    describe,
)
from executor.fd_room import ensure_fd_room
from executor.launch import distributed_init_method, start_workers, wait_ready
from executor.monitor import WorkerMonitor
from executor.protocol import ALL_RANKS, REQUEST, method_name, span_name
from executor.remote_site import RemoteSite, release
from executor.resources import ExecutorResources
from executor.serialization import encode
from executor.shm_queue import QueueReader, QueueSpec, QueueWriter, ShmRingBuffer
from executor.transport import BroadcastWriter, MessageReader, MessageWriter
from executor.waiting import DEFAULT_POLICY, Doorbell, WaitPolicy, Warmth
from telemetry import rpc_trace
from telemetry.journal import OWNER_SPAN
from telemetry.rpc_trace import SPAN_ID, TRACE_ID, RpcTrace

log = logging.getLogger("executor")
FailureCallback = Callable[[], None]
_RPC_NAMES: dict[str, str] = {}  # method name -> RPC span name, made once per name


class MultiprocExecutor:
    """Runs ``cfg.world_size`` worker processes and broadcasts calls to them."""

    def __init__(self, cfg: ExecutorConfig, *, wait_policy: WaitPolicy = DEFAULT_POLICY) -> None:
        if not isinstance(cfg, ExecutorConfig):
            raise TypeError(f"cfg must be an ExecutorConfig, got {type(cfg).__name__}")
        shm.sweep_stale()
        self.config = cfg
        self._res = ExecutorResources(cfg)
        self._site = RemoteSite()  # nnodes > 1: the hub the remote agents keep across incarnations
        self._finalizer = weakref.finalize(self, release, self._res, self._site)
        self._failure: ExecutorFailedError | None = None  # set once: failed, or shut down
        self._failed = False  # the executor failed (not merely shut down): callbacks are due
        self._callbacks: list[FailureCallback] = []
        self._callbacks_ran = False  # set once per incarnation, under _state_lock, by whoever runs them
        # restart() (executor/restart.py) starts a new incarnation of every worker after a
        # failure; incarnation counts them (0 = the first), restarts_used against the budget.
        self.incarnation = 0
        self.restarts_used = 0
        self.restart_lock = threading.Lock()  # one restart at a time; shutdown() waits for it
        self._closed = False  # shutdown() was called: never restart again
        self._state_lock = threading.Lock()
        self._send_lock = self._res.send_lock
        self._ids = itertools.count(1)
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
    def output_rank(self) -> int:
        return self.config.output_rank

    @property
    def max_concurrent_batches(self) -> int:
        return self.config.max_concurrent_batches

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

    def register_failure_callback(self, callback: FailureCallback) -> None:
        """Call ``callback()`` once when the executor fails; at once if it already has.

        After ``restart()`` the callbacks stay registered: each failure of each incarnation
        runs them once (``ex.incarnation`` says which incarnation failed).

        Every way of failing counts (worker death, node loss, queue damage, a protocol
        error); a plain ``shutdown()`` is not a failure.  A callback that raises is logged."""
        self._check_owner()
        with self._state_lock:
            if not self._callbacks_ran:
                self._callbacks.append(callback)
                return
            failed = self._failed
            if failed:  # reported now, and again if a restarted incarnation fails
                self._callbacks.append(callback)
        if failed:
            _run_callback(callback)

    def restart(self, reason: str = "restart requested") -> None:
        """Replace every worker with a new incarnation; see executor/restart.py.

        Fails the current incarnation first if it is still serving (``reason`` names why).
        Raises ``ExecutorFailedError`` when the budget is spent or after ``shutdown()``."""
        from executor.restart import restart_workers

        self._check_owner()
        restart_workers(self, reason)

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

    def collective_rpc(
        self,
        method: str | Callable[..., Any],
        timeout: float | None = None,
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
        non_block: bool = False,
        unique_reply_rank: int | None = None,
        aggregator: Callable[[list[Any]], Any] | None = None,
    ) -> Any:
        """Run ``method`` on every worker; see docs/design.md, section 1, for the whole contract."""
        self._check_owner()
        try:
            self._check_call(method, timeout, args, kwargs, unique_reply_rank, aggregator)
            call = self._submit(method, timeout, tuple(args), dict(kwargs or {}), unique_reply_rank,
                                aggregator, non_block)
        except ExecutorFailedError:
            self._refuse_after_failure(timeout)
            raise
        finally:
            self._collector.settle_resolved(0.0)  # what relieving the queue resolved, lock-free
        if non_block:
            return call.future
        try:
            self._collector.drain_until(call, call.deadline)
        except KeyboardInterrupt:
            call.abandoned = True  # its replies are drained and dropped by the next drain
            raise
        if not call.done:  # an earlier call held us up past our own deadline
            self._collector.resolve(call, self._collector.timeout_error(call, call.ranks[0]))
        return call.outcome()

    def _refuse_after_failure(self, timeout: float | None) -> None:
        """A call refused because the executor failed comes after every earlier call: their
        futures fail first (the monitor thread may still be failing them), in order."""
        self._collector_fail_all()
        limit = float("inf") if timeout is None else time.monotonic() + timeout
        self._collector.settle_resolved(limit)

    def shutdown(self) -> None:
        """Stop every worker (grace, SIGTERM, SIGKILL) and release everything; idempotent.

        In a forked child it does nothing: the workers belong to the parent."""
        if not self._res.owned():
            return
        self._closed = True
        cfg = self.config  # a restart in progress sees _closed and gives up: wait for it
        if self.restart_lock.acquire(timeout=cfg.startup_timeout + cfg.shutdown_grace + 10):
            self.restart_lock.release()
        with self._state_lock:
            if self._failure is None:
                self._failure = ExecutorFailedError("the executor was shut down")
            if not self._failed:
                self._callbacks_ran, self._callbacks = True, []  # no failure to report, ever
        self._res.cancel()
        self._finalizer()
        self._collector_fail_all()
        collector = getattr(self, "_collector", None)
        if collector is not None:
            collector.settle_resolved()  # every future is done when shutdown() returns
        thread = self._res.failure_thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(self.config.shutdown_grace + self.config.sigterm_grace + 10)

    def __enter__(self) -> MultiprocExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # ------------------------------------------------------------------ incarnations
    # The restart protocol: executor/restart.py decides when, how often and by which
    # deadline; only these methods touch the incarnation's state (failure flags, resources,
    # finalizer, locks).  Callers hold ``restart_lock``.

    def check_restartable(self) -> None:
        """Raise ``RestartAborted`` once ``shutdown()`` was called."""
        if self._closed or (self._failure is not None and not self._failed):
            raise RestartAborted("the executor was shut down; it cannot restart")

    def fail_for_restart(self, reason: str) -> None:
        """A hung or healthy incarnation is failed like any other (callbacks run once)."""
        if self._failure is None:
            self._fail(ExecutorFailedError(f"restart requested: {reason}; every pending call "
                                           "failed"), inline=True)

    def wait_for_old_incarnation(self) -> None:
        """The old incarnation's processes are reaped and its memory and pipes closed."""
        res = self._res
        res.shutdown()
        thread = res.failure_thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(self.config.shutdown_grace + self.config.sigterm_grace + 10)

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
        """Swap in the new incarnation; lock order as elsewhere: send, reply, state."""
        with res.send_lock, res.reply_lock, self._state_lock:
            if self._closed:
                raise RestartAborted("the executor was shut down while it restarted")
            self._send_lock = res.send_lock
            self._failure, self._failed, self._callbacks_ran = None, False, False
            self.incarnation += 1
        if self._rec.enabled:
            self._rec.event("executor.incarnation", {"faultlab.incarnation": self.incarnation,
                                                     "faultlab.worker_pids": str(self.worker_pids)})

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

    def _check_owner(self) -> None:
        if not self._res.owned():
            raise ForeignProcessError(
                f"this executor belongs to process {self._res.owner_pid}; process {os.getpid()} "
                "(a fork of it) cannot use it: create an executor in the child instead"
            )

    def _check_call(
        self, method: Any, timeout: float | None, args: Any, kwargs: Any, reply_rank: int | None,
        aggregator: Any,
    ) -> None:
        check_call(method, timeout, args, kwargs, reply_rank, aggregator, self.config.world_size)
        self._raise_failure()

    def _submit(
        self, method: Any, timeout: float | None, args: tuple[Any, ...], kwargs: dict[str, Any],
        reply_rank: int | None, aggregator: Callable[[list[Any]], Any] | None, non_block: bool,
    ) -> PendingCall:
        name = method_name(method)
        deadline = float("inf") if timeout is None else time.monotonic() + timeout
        ranks = list(range(self.config.world_size)) if reply_rank is None else [reply_rank]
        future = RpcFuture(self._collector) if non_block else None
        call = PendingCall(0, name, ranks, reply_rank is not None, timeout, deadline, future, aggregator)
        if future is not None:
            future.call = call
        with self._send_lock:
            self._raise_failure()  # checked again under the lock: the queues may be closing
            call.rpc_id = next(self._ids)
            trace = None
            if self._rec.enabled:
                # The RPC's span, begun before the request is sent (a driver that dies
                # mid-RPC leaves it truncated); a child of the caller's current trace
                # (OpenTelemetry context or TRACEPARENT), else a new trace.  Its phases are
                # plain data on the call until it ends (telemetry.rpc_trace).
                name = _RPC_NAMES.get(call.method) or span_name(_RPC_NAMES, "rpc ", call.method)
                trace = self._rec.begin_rpc(name, telemetry.caller_parent(), call.rpc_id)
            parts = self._encode(call, method, args, kwargs, reply_rank, trace)
            self._enqueue(call, parts, trace)
            call.trace = trace
            self._collector.pending.append(call)
        return call

    def _encode(
        self, call: PendingCall, method: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
        reply_rank: int | None, trace: RpcTrace | None,
    ) -> list[Any]:
        try:
            if failpoints.ACTIVE:
                failpoints.fire("driver.before_pickle", msg_id=call.rpc_id, method=call.method)
            rank = ALL_RANKS if reply_rank is None else reply_rank
            if trace is None:
                return encode(REQUEST, rank, (method, args, kwargs), from_main(method))
            # The span's context rides in the frame header (sent only for a recorded span).
            return encode(REQUEST, rank, (method, args, kwargs), from_main(method),
                          trace[TRACE_ID], trace[SPAN_ID], telemetry.FLAG_SAMPLED)
        except KeyboardInterrupt:
            if trace is not None:
                self._end_trace(call, trace, None)
            raise
        except BaseException as exc:  # even sys.exit in a __reduce__ fails this call only
            error = RequestPicklingError(
                f"collective_rpc({call.method!r}): the method or its arguments cannot be "
                f"pickled ({describe(exc)}); nothing was sent"
            )
            if trace is not None:
                self._end_trace(call, trace, error)
            raise error from exc

    def _enqueue(self, call: PendingCall, parts: list[Any], trace: RpcTrace | None) -> None:
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

    def _call_resolved(self, call: PendingCall, error: BaseException | None) -> None:
        trace = call.trace
        if trace is not None:
            if error is None:  # the common case: one call, one record
                rpc_trace.end_rpc(self._rec, trace, None, call.rpc_id, call.future is not None,
                                  call.timeout, call.ranks[0] if call.unique else None)
            else:
                self._end_trace(call, trace, error)

    def _end_trace(self, call: PendingCall, trace: RpcTrace, error: BaseException | None) -> None:
        """End the RPC's span, with ``error`` (also its type as ``faultlab.outcome``)."""
        if error is not None:
            self._rec.write_attribute(OWNER_SPAN, trace[SPAN_ID], "faultlab.outcome",
                                      type(error).__name__)
        rpc_trace.end_rpc(self._rec, trace, error, call.rpc_id, call.future is not None,
                          call.timeout, call.ranks[0] if call.unique else None)

    # ------------------------------------------------------------------ failure

    def _raise_failure(self) -> None:
        failure = self._failure
        if failure is not None:
            raise failure.again()

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

    def _fail(self, error: ExecutorFailedError, *, inline: bool = False) -> None:
        """Mark the executor failed (once), wake every waiter, fail every pending call, then
        stop the workers and run the failure callbacks: here when the calling thread holds
        no lock of ours (``inline``), else on a thread of their own."""
        with self._state_lock:
            if self._failure is not None:
                return
            self._failure, self._failed = error, True
        log.error("executor failed: %s", error)
        self._res.cancel()
        self._collector_fail_all()
        if inline:
            self._after_failure()
            return
        thread = threading.Thread(target=self._after_failure, name="faultlab-failure", daemon=True)
        self._res.failure_thread = thread
        thread.start()

    def _after_failure(self) -> None:
        self._res.shutdown()
        collector = getattr(self, "_collector", None)
        if collector is not None:
            collector.settle_resolved(0.0)  # a thread already settling settles them all
        self._run_callbacks()

    def _collector_fail_all(self) -> None:
        collector = getattr(self, "_collector", None)
        if collector is not None and self._failure is not None:
            for call in list(collector.pending):
                collector.resolve(call, self._failure.again())

    def _run_callbacks(self) -> None:
        with self._state_lock:
            if self._callbacks_ran:
                return
            self._callbacks_ran = True
            callbacks = list(self._callbacks)  # kept: a restarted executor reports its next failure too
        for callback in callbacks:
            _run_callback(callback)


def _run_callback(callback: FailureCallback) -> None:
    try:
        callback()
    except Exception:
        log.exception("executor failure callback raised")
