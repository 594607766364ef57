"""``RayExecutor``: the ``MultiprocExecutor`` contract with Ray actors as the workers.

    caller ── collective_rpc ──► encode (our wire format) ──► ray.put once if large
       │            └──► deliver.remote(rpc_id, frame) on every rank's actor (in order)
       ▲                                   │ (executor/ray_actor.py: the usual serve loop)
       └── future / result ◄── ReplyCollector (executor/calls.py) ◄── RayReplyReader per rank
    monitor thread: ray.wait on every actor's watch() ref ──► a death ──► _fail()
    the group (executor/ray_group.py): placement group + actors of one incarnation

What is the same as the shm executor: request ids, stale replies dropped, ordered futures
and every error type come from the same ReplyCollector and worker loop; a death fails every
pending and later call with ``ExecutorFailedError`` naming rank, pid and node, and the
failure callbacks run once; ``restart()`` is executor/restart.py's.  What Ray does
differently: workers are actors placed by Ray (one CPU each, SPREAD over the nodes), so
there is no death pipe and no signal handling of ours: Ray kills a driver's actors when
the driver dies (owner death), ``shutdown`` is ``ray.kill``; an exit code is not known
(Ray reports a death in its own words, which the error quotes).

Invariants:
- ``_send_lock`` orders request ids, the deliver calls of every rank and the pending deque.
- After ``_fail`` the executor never serves again until a restart: every wait wakes (the
  actors are killed, their watch refs fail), every call raises ``ExecutorFailedError``.
- ``shutdown`` is idempotent and bounded (``shutdown_grace`` + ``sigterm_grace`` for the
  actors to be confirmed dead); ``ray.shutdown()`` only if this executor connected to Ray.
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
from executor.call_checks import check_call, from_main
from executor.calls import PendingCall, ReplyCollector, RpcFuture
from executor.config import ExecutorConfig
from executor.errors import (
    ExecutorFailedError,
    ForeignProcessError,
    RequestPicklingError,
    RestartAborted,
    describe,
)
from executor.protocol import ALL_RANKS, REQUEST, method_name
from executor.ray_cluster import apply_ray_env
from executor.serialization import encode
from telemetry import rpc_trace
from telemetry.rpc_trace import SPAN_ID, TRACE_ID, RpcTrace

log = logging.getLogger("executor.ray")
FailureCallback = Callable[[], None]
INLINE_BYTES = 100 * 1024  # larger requests go to the object store once, for every rank


def _connect(address: str | None) -> bool:
    """ray.init unless this process is connected already; True if we connected."""
    apply_ray_env()
    import ray

    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS") or None
    extra: dict[str, Any] = {}
    if address is None or address.startswith(("127.", "localhost")):
        extra["_node_ip_address"] = "127.0.0.1"
    ray.init(address=address, log_to_driver=False, include_dashboard=False, **extra)
    return True


class RayExecutor:
    """``cfg.world_size`` Ray actors, each running ``cfg.worker``; calls broadcast to all.

    ``address``: the Ray cluster (``host:port``); default ``RAY_ADDRESS``, else a Ray this
    process is already connected to, else a new local one."""

    def __init__(self, cfg: ExecutorConfig, *, address: str | None = None) -> None:
        if not isinstance(cfg, ExecutorConfig):
            raise TypeError(f"cfg must be an ExecutorConfig, got {type(cfg).__name__}")
        if cfg.nnodes != 1:
            raise ValueError("RayExecutor places workers with Ray: leave nnodes at 1")
        self.config = cfg
        self._owner = os.getpid()
        self._owns_ray = _connect(address)
        from executor import ray_group

        self._groups = ray_group
        self._rec = telemetry.get_recorder()
        self._ids = itertools.count(1)
        self._send_lock = threading.Lock()
        self._reply_lock = threading.RLock()
        self._state_lock = threading.Lock()
        self.restart_lock = threading.Lock()
        self._failure: ExecutorFailedError | None = None
        self._failed = False
        self._closed = False
        self._callbacks: list[FailureCallback] = []
        self._callbacks_ran = False
        self._failure_thread: threading.Thread | None = None
        self.incarnation = 0
        self.restarts_used = 0
        self.startup_s = 0.0
        self._group: Any = None
        self._monitor: threading.Thread | None = None
        self._finalizer = weakref.finalize(self, _release, [None], self._owns_ray)
        try:
            self._start(cfg.startup_timeout)
        except BaseException:
            self._finalizer()
            raise

    # ------------------------------------------------------------------ start-up

    def _start(self, timeout: float) -> None:
        started = time.monotonic()
        group = self._groups.RayGroup(self.config)
        self._finalizer.detach()
        self._finalizer = weakref.finalize(self, _release, [group], self._owns_ray)
        span = self._rec.start_span("executor.startup", telemetry.caller_parent(), {
            "faultlab.world_size": self.config.world_size, "faultlab.worker": self.config.worker,
            "faultlab.backend": "ray"}) if self._rec.enabled else None
        try:
            group.start(started + min(timeout, self.config.startup_timeout))
        except BaseException as exc:
            group.stop(self.config.shutdown_grace)
            if span is not None:
                span.end(exc)
            raise
        readers = [self._groups.RayReplyReader(r, group, self._death) for r in range(len(group.actors))]
        self._readers = readers
        self._collector = ReplyCollector(readers, self._reply_lock, lambda: self._failure,  # type: ignore[arg-type]
                                         self._fail, self._call_resolved, self._rec)
        self._group = group
        self._monitor = threading.Thread(target=self._watch, args=(group,),
                                         name="faultlab-ray-monitor", daemon=True)
        self._monitor.start()
        self.startup_s = time.monotonic() - started
        if span is not None:
            span.set_attribute("faultlab.worker_pids", str(group.pids))
            span.end()

    def _watch(self, group: Any) -> None:
        """The monitor thread: the first actor death of ``group`` fails the executor."""
        import ray

        while not group.stopping:
            ready, _ = ray.wait(group.watch_refs, num_returns=1, timeout=1.0)
            if ready and not group.stopping:
                rank = group.watch_refs.index(ready[0])
                try:
                    ray.get(ready[0])
                except Exception as exc:  # noqa: BLE001 - RayActorError & co.
                    self._death(rank, exc, time.time_ns(), group)
                return

    def _death(self, rank: int, exc: BaseException, detected_ns: int,
               group: Any = None) -> ExecutorFailedError:
        """Rank ``rank``'s actor died: fail the executor (once); the error for the caller."""
        group = group or self._group
        if group is not self._group:
            return ExecutorFailedError("a worker of an earlier incarnation died")
        error = group.describe_death(rank, exc)
        if self._rec.enabled:
            self._rec.event("executor.worker_death", {
                "faultlab.rank": rank, "process.pid": group.pids[rank],
                "faultlab.node": group.node_names[rank], "faultlab.detected_ns": detected_ns})
        self._fail(error, inline=threading.current_thread() is self._monitor)
        failure = self._failure
        return (failure or error).again()

    # ------------------------------------------------------------------ public API

    @property
    def worker_pids(self) -> list[int]:
        return list(self._group.pids) if self._group is not None else []

    @property
    def worker_nodes(self) -> list[str]:
        """Each rank's Ray node (``nodeK`` on a LocalRayCluster, else its id's start)."""
        return list(self._group.node_names) if self._group is not None else []

    @property
    def is_failed(self) -> bool:
        return self._failed

    @property
    def output_rank(self) -> int:
        return self.config.output_rank

    @property
    def max_concurrent_batches(self) -> int:
        return self.config.max_concurrent_batches

    def register_failure_callback(self, callback: FailureCallback) -> None:
        self._check_owner()
        with self._state_lock:
            if not self._callbacks_ran:
                self._callbacks.append(callback)
                return
            failed = self._failed
            if failed:
                self._callbacks.append(callback)
        if failed:
            _run_callback(callback)

    def check_health(self, timeout: float = 10.0) -> None:
        """Raise ExecutorFailedError if the executor failed or any actor does not answer."""
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        self._check_owner()
        self._raise_failure()
        group = self._group
        refs = [a.info.options(concurrency_group="control").remote() for a in group.actors]
        for rank, ref in enumerate(refs):
            try:
                ray.get(ref, timeout=timeout)
            except RayActorError as exc:
                raise self._death(rank, exc, time.time_ns()) from None
            except GetTimeoutError:
                raise ExecutorFailedError(f"worker rank {rank} (pid {group.pids[rank]}) did not "
                                          f"answer a health check within {timeout:g} s",
                                          rank=rank, pid=group.pids[rank]) from None

    def restart(self, reason: str = "restart requested") -> None:
        """Replace every actor with a new incarnation (a new placement group); see
        executor/restart.py."""
        from executor.restart import restart_workers

        self._check_owner()
        restart_workers(self, reason)

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
        """Run ``method`` on every worker; the contract of ``MultiprocExecutor.collective_rpc``."""
        self._check_owner()
        check_call(method, timeout, args, kwargs, unique_reply_rank, aggregator,
                   self.config.world_size)
        try:
            self._raise_failure()
            call = self._submit(method, timeout, tuple(args), dict(kwargs or {}),
                                unique_reply_rank, aggregator, non_block)
        except ExecutorFailedError:  # refused after a failure: earlier futures fail first
            self._fail_pending()
            self._collector.settle_resolved(
                float("inf") if timeout is None else time.monotonic() + timeout)
            raise
        if non_block:
            return call.future
        try:
            self._collector.drain_until(call, call.deadline)
        except KeyboardInterrupt:
            call.abandoned = True
            raise
        if not call.done:  # an earlier call held us up past our own deadline
            self._collector.resolve(call, self._collector.timeout_error(call, call.ranks[0]))
        return call.outcome()

    def shutdown(self) -> None:
        """Kill every actor and release the placement group; idempotent and bounded."""
        if os.getpid() != self._owner:
            return
        self._closed = True
        cfg = self.config
        if self.restart_lock.acquire(timeout=cfg.startup_timeout + cfg.shutdown_grace + 10):
            self.restart_lock.release()
        with self._state_lock:
            if self._failure is None:
                self._failure = ExecutorFailedError("the executor was shut down")
            if not self._failed:
                self._callbacks_ran, self._callbacks = True, []
        self._stop_group()
        self._fail_pending()
        thread = self._failure_thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(cfg.shutdown_grace + cfg.sigterm_grace + 10)
        self._finalizer()

    def __enter__(self) -> RayExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # ------------------------------------------------------------------ incarnations
    # The protocol of executor/restart.py, as in MultiprocExecutor.

    def check_restartable(self) -> None:
        if self._closed or (self._failure is not None and not self._failed):
            raise RestartAborted("the executor was shut down; it cannot restart")

    def fail_for_restart(self, reason: str) -> None:
        if self._failure is None:
            self._fail(ExecutorFailedError(f"restart requested: {reason}; every pending call "
                                           "failed"), inline=True)

    def wait_for_old_incarnation(self) -> None:
        self._stop_group()
        thread = self._failure_thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(self.config.shutdown_grace + self.config.sigterm_grace + 10)

    def start_incarnation(self, startup_timeout: float) -> None:
        """A new group (placement group, actors, rendezvous), then the swap under the locks."""
        self._start(startup_timeout)
        with self._send_lock, self._reply_lock, self._state_lock:
            if self._closed:
                raise RestartAborted("the executor was shut down while it restarted")
            self._failure, self._failed, self._callbacks_ran = None, False, False
            self.incarnation += 1
        if self._rec.enabled:
            self._rec.event("executor.incarnation", {"faultlab.incarnation": self.incarnation,
                                                     "faultlab.worker_pids": str(self.worker_pids)})

    # ------------------------------------------------------------------ calls

    def _check_owner(self) -> None:
        if os.getpid() != self._owner:
            raise ForeignProcessError(
                f"this executor belongs to process {self._owner}; process {os.getpid()} "
                "(a fork of it) cannot use it: create an executor in the child instead")

    def _raise_failure(self) -> None:
        failure = self._failure
        if failure is not None:
            raise failure.again()

    def _submit(
        self, method: Any, timeout: float | None, args: tuple[Any, ...], kwargs: dict[str, Any],
        reply_rank: int | None, aggregator: Callable[[list[Any]], Any] | None, non_block: bool,
    ) -> PendingCall:
        deadline = float("inf") if timeout is None else time.monotonic() + timeout
        ranks = list(range(self.config.world_size)) if reply_rank is None else [reply_rank]
        future = RpcFuture(self._collector) if non_block else None
        call = PendingCall(0, method_name(method), ranks, reply_rank is not None, timeout,
                           deadline, future, aggregator)
        if future is not None:
            future.call = call
        with self._send_lock:
            self._raise_failure()
            call.rpc_id = next(self._ids)
            trace = None
            if self._rec.enabled:
                trace = self._rec.begin_rpc(f"rpc {call.method}", telemetry.caller_parent(),
                                            call.rpc_id)
            frame = self._encode(call, method, args, kwargs, reply_rank, trace)
            self._deliver(call, frame, trace)
            call.trace = trace
            self._collector.pending.append(call)
        return call

    def _encode(self, call: PendingCall, method: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                reply_rank: int | None, trace: RpcTrace | None) -> bytes:
        rank = ALL_RANKS if reply_rank is None else reply_rank
        try:
            if trace is None:
                parts = encode(REQUEST, rank, (method, args, kwargs), from_main(method))
            else:
                parts = encode(REQUEST, rank, (method, args, kwargs), from_main(method),
                               trace[TRACE_ID], trace[SPAN_ID], telemetry.FLAG_SAMPLED)
            return b"".join(parts)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:
            error = RequestPicklingError(
                f"collective_rpc({call.method!r}): the method or its arguments cannot be "
                f"pickled ({describe(exc)}); nothing was sent")
            if trace is not None:
                self._end_trace(call, trace, error)
            raise error from exc

    def _deliver(self, call: PendingCall, frame: bytes, trace: RpcTrace | None) -> None:
        import ray

        start_ns = time.time_ns() if trace is not None else 0
        payload = ray.put(frame) if len(frame) > INLINE_BYTES else frame
        refs = [a.deliver.remote(call.rpc_id, payload) for a in self._group.actors]
        for rank in call.ranks:
            self._readers[rank].push(call.rpc_id, refs[rank])
        if trace is not None:
            trace += (start_ns, time.time_ns(), len(frame))

    def _call_resolved(self, call: PendingCall, error: BaseException | None) -> None:
        if call.trace is not None:
            self._end_trace(call, call.trace, error)

    def _end_trace(self, call: PendingCall, trace: RpcTrace, error: BaseException | None) -> None:
        rpc_trace.end_rpc(self._rec, trace, error, call.rpc_id, call.future is not None,
                          call.timeout, call.ranks[0] if call.unique else None)

    # ------------------------------------------------------------------ failure

    def _fail(self, error: ExecutorFailedError, *, inline: bool = False) -> None:
        with self._state_lock:
            if self._failure is not None:
                return
            self._failure, self._failed = error, True
        log.error("executor failed: %s", error)
        self._fail_pending()
        if inline:
            self._after_failure()
            return
        thread = threading.Thread(target=self._after_failure, name="faultlab-failure", daemon=True)
        self._failure_thread = thread
        thread.start()

    def _after_failure(self) -> None:
        self._stop_group()
        self._collector.settle_resolved(0.0)  # a thread already settling settles them all
        self._run_callbacks()

    def _stop_group(self) -> None:
        group = self._group
        if group is not None:
            group.stop(self.config.shutdown_grace + self.config.sigterm_grace)
        monitor = self._monitor
        if monitor is not None and monitor is not threading.current_thread():
            monitor.join(5.0)

    def _fail_pending(self) -> None:
        collector = getattr(self, "_collector", None)
        failure = self._failure
        if collector is None or failure is None:
            return
        for call in list(collector.pending):
            collector.resolve(call, failure.again())
        collector.settle_resolved(0.0)  # never wait here: the caller may hold the collector's lock

    def _run_callbacks(self) -> None:
        with self._state_lock:
            if self._callbacks_ran:
                return
            self._callbacks_ran = True
            callbacks = list(self._callbacks)
        for callback in callbacks:
            _run_callback(callback)


def _release(groups: list[Any], owns_ray: bool) -> None:
    """At garbage collection or exit: kill the group's actors; disconnect if we connected."""
    for group in groups:
        if group is not None:
            group.stop(2.0)
    if owns_ray:
        import ray

        ray.shutdown()


def _run_callback(callback: FailureCallback) -> None:
    try:
        callback()
    except Exception:
        log.exception("executor failure callback raised")
