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
failure callbacks run once; ``restart()`` is executor/restart.py's.  That shared part
(failure state, callbacks, the restart swap, the call path) is executor/lifecycle.py.  What Ray does
differently: workers are actors placed by Ray (one CPU each, SPREAD over the nodes), so
there is no death pipe and no signal handling of ours: Ray kills a driver's actors when
the driver dies (owner death), ``shutdown`` is ``ray.kill``; an exit code is not known
(Ray reports a death in its own words, which the error quotes).

Invariants:
- ``_send_lock`` orders request ids, the deliver calls of every rank and the pending deque.
- After ``_fail`` the executor never serves again until a restart: every wait wakes (the
  actors are killed, their watch refs fail), every call raises ``ExecutorFailedError``.
- A restart's new group goes live only through ``_swap_in``; an actor that died before
  the swap (its monitor's report was dropped: the executor was still failed) is found
  right after it, from its watch ref, and fails the attempt (restart.py retries).
- ``shutdown`` is idempotent and bounded (``shutdown_grace`` + ``sigterm_grace`` for the
  actors to be confirmed dead); ``ray.shutdown()`` only if this executor connected to Ray.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from typing import Any

import telemetry
from executor.calls import PendingCall, ReplyCollector
from executor.config import ExecutorConfig
from executor.errors import ExecutorFailedError
from executor.lifecycle import ExecutorLifecycle
from executor.ray_cluster import apply_ray_env
from telemetry.rpc_trace import RpcTrace

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


class RayExecutor(ExecutorLifecycle):
    """``cfg.world_size`` Ray actors, each running ``cfg.worker``; calls broadcast to all.

    ``address``: the Ray cluster (``host:port``); default ``RAY_ADDRESS``, else a Ray this
    process is already connected to, else a new local one."""

    def __init__(self, cfg: ExecutorConfig, *, address: str | None = None) -> None:
        if not isinstance(cfg, ExecutorConfig):
            raise TypeError(f"cfg must be an ExecutorConfig, got {type(cfg).__name__}")
        if cfg.nnodes != 1:
            raise ValueError("RayExecutor places workers with Ray: leave nnodes at 1")
        self._init_lifecycle(cfg)
        self._owner = os.getpid()
        self._owns_ray = _connect(address)
        from executor import ray_group

        self._groups = ray_group
        self._rec = telemetry.get_recorder()
        self._send_lock = threading.Lock()
        self._reply_lock = threading.RLock()
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

    def shutdown(self) -> None:
        """Kill every actor and release the placement group; idempotent and bounded."""
        if os.getpid() != self._owner:
            return
        self._close()
        self._stop_group()
        self._fail_pending()
        self._join_failure_thread()
        self._finalizer()

    # ------------------------------------------------------------------ incarnations
    # The protocol of executor/restart.py (executor/lifecycle.py has the rest).

    def start_incarnation(self, startup_timeout: float) -> None:
        """A new group (placement group, actors, rendezvous), then the swap under the locks,
        then a look for an actor that died before the swap."""
        self._start(startup_timeout)
        self._swap_in(self._send_lock, self._reply_lock)
        self._report_early_death(self._group)

    def _report_early_death(self, group: Any) -> None:
        """An actor of ``group`` that died before the swap: its monitor's report found us
        still failed and was dropped, and the monitor is gone.  Its watch ref says so (it is
        ready once the actor is dead): fail this incarnation now, and let the restart retry."""
        import ray

        ready, _ = ray.wait(group.watch_refs, num_returns=len(group.watch_refs), timeout=0)
        for ref in ready:
            rank = group.watch_refs.index(ref)
            try:
                ray.get(ref)
            except Exception as exc:  # noqa: BLE001 - RayActorError & co.
                self._death(rank, exc, time.time_ns(), group)
            raise ExecutorFailedError(f"worker rank {rank} of the new incarnation died during "
                                      "the restart")

    # ------------------------------------------------------------------ calls

    def _owned(self) -> bool:
        return os.getpid() == self._owner

    def _owner_pid(self) -> int:
        return self._owner

    def _send_request(self, call: PendingCall, parts: list[Any], trace: RpcTrace | None) -> None:
        import ray

        frame = b"".join(parts)
        start_ns = time.time_ns() if trace is not None else 0
        payload = ray.put(frame) if len(frame) > INLINE_BYTES else frame
        refs = [a.deliver.remote(call.rpc_id, payload) for a in self._group.actors]
        for rank in call.ranks:
            self._readers[rank].push(call.rpc_id, refs[rank])
        if trace is not None:
            trace += (start_ns, time.time_ns(), len(frame))

    # ------------------------------------------------------------------ failure

    def _stop_workers(self) -> None:
        self._stop_group()

    def _stop_group(self) -> None:
        group = self._group
        if group is not None:
            group.stop(self.config.shutdown_grace + self.config.sigterm_grace)
        monitor = self._monitor
        if monitor is not None and monitor is not threading.current_thread():
            monitor.join(5.0)

    def _fail_pending(self) -> None:
        super()._fail_pending()
        collector = getattr(self, "_collector", None)
        if collector is not None:  # never wait here: the caller may hold the collector's lock
            collector.settle_resolved(0.0)


def _release(groups: list[Any], owns_ray: bool) -> None:
    """At garbage collection or exit: kill the group's actors; disconnect if we connected."""
    for group in groups:
        if group is not None:
            group.stop(2.0)
    if owns_ray:
        import ray

        ray.shutdown()

