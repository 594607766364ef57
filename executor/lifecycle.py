"""What every executor backend shares: its failure state, the failure callbacks, the restart
protocol's side of the swap, and the shape of a call (``MultiprocExecutor``, ``RayExecutor``).

    collective_rpc ─► check_call ─► _submit ─┬─► _encode (request frame, parts)
                                             └─► _send_request (backend: shm ring | Ray actors)
                                                 then pending.append; replies: ReplyCollector

    serving ──_fail(error)──► failed ──_after_failure: stop workers, settle futures,
       ▲                        │      run the callbacks once (on no lock of ours)
       │                        ├──restart: fail_for_restart / wait_for_old_incarnation /
       └──── _swap_in ◄─────────┘  start_incarnation (the backend's) ─► _swap_in
    serving | failed ──shutdown: _close──► closed (never serves, never restarts again)

A backend supplies what differs: how workers start and stop (``_stop_workers``), how a
request reaches them (``_send_request``), how waiters are woken (``_wake_waiters``), who owns
it (``_owned``, ``_owner_pid``), and its own ``shutdown``, ``check_health`` and ``is_failed``.

Invariants (the fields are set here, in ``_init_lifecycle``):
- Lock order: send, reply, state.  ``_state_lock`` guards ``_failure``, ``_failed``,
  ``_callbacks`` and ``_callbacks_ran``; callbacks run with none of our locks held.
- ``_failure`` is set once per incarnation (failed, or shut down); only ``_swap_in`` clears
  it, under every lock, and never once ``_closed`` is set.
- ``_failed`` means a failure (callbacks are due), not a plain shutdown: a shutdown that
  finds no failure drops the callbacks, so they never run.
- ``restart_lock``: one restart at a time; ``shutdown`` waits (bounded) for it.
- A failure is handled (waiters woken, pending calls failed, workers stopped, callbacks
  run) by the thread that failed us or a thread of its own; a restart waits (bounded) for
  that handling to finish before it touches the incarnation (``_failure_handled``), so a
  failure is never handled on the incarnation that replaced the one that failed (a monitor
  thread held up past the resources' join used to stop the new workers, un-failed).
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Self

import telemetry
from executor import failpoints
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
from executor.protocol import ALL_RANKS, REQUEST, method_name, span_name
from executor.serialization import encode
from telemetry import rpc_trace
from telemetry.journal import OWNER_SPAN
from telemetry.recorder import Recorder
from telemetry.rpc_trace import SPAN_ID, TRACE_ID, RpcTrace

log = logging.getLogger("executor")
FailureCallback = Callable[[], None]
_RPC_NAMES: dict[str, str] = {}  # method name -> RPC span name, made once per name


class ExecutorLifecycle:
    """The failure state machine and call path of an executor; backends subclass it."""

    config: ExecutorConfig
    _collector: ReplyCollector  # set by the backend's start-up
    _rec: Recorder
    _send_lock: threading.Lock  # orders request ids, the sends and the pending deque

    def _init_lifecycle(self, cfg: ExecutorConfig) -> None:
        self.config = cfg
        self._failure: ExecutorFailedError | None = None  # set once: failed, or shut down
        self._failed = False  # the executor failed (not merely shut down): callbacks are due
        self._callbacks: list[FailureCallback] = []
        self._callbacks_ran = False  # set once per incarnation, under _state_lock, by whoever runs them
        self._failure_thread: threading.Thread | None = None  # runs a failure's stop + callbacks
        self._failure_handled: threading.Event | None = None  # set once _fail's work is all done
        self._failure_handler: threading.Thread | None = None  # the thread doing that work
        # restart() (executor/restart.py) starts a new incarnation of every worker after a
        # failure; incarnation counts them (0 = the first), restarts_used against the budget.
        self.incarnation = 0
        self.restarts_used = 0
        self.restart_lock = threading.Lock()  # one restart at a time; shutdown() waits for it
        self._closed = False  # shutdown() was called: never restart again
        self._state_lock = threading.Lock()
        self._ids = itertools.count(1)

    # ------------------------------------------------------------------ backend hooks

    def _owned(self) -> bool:
        """True in the process that created the executor (not in a fork of it)."""
        raise NotImplementedError

    def _owner_pid(self) -> int:
        raise NotImplementedError

    def _stop_workers(self) -> None:
        """Stop this incarnation's workers and release them; idempotent."""
        raise NotImplementedError

    def _send_request(self, call: PendingCall, parts: list[Any], trace: RpcTrace | None) -> None:
        """Deliver the encoded request to every worker (under ``_send_lock``)."""
        raise NotImplementedError

    def _wake_waiters(self) -> None:
        """At failure: wake every thread waiting for this executor (default: nothing to do)."""

    # ------------------------------------------------------------------ public API

    @property
    def output_rank(self) -> int:
        return self.config.output_rank

    @property
    def max_concurrent_batches(self) -> int:
        return self.config.max_concurrent_batches

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
            check_call(method, timeout, args, kwargs, unique_reply_rank, aggregator,
                       self.config.world_size)
            self._raise_failure()
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

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def shutdown(self) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------------ incarnations
    # The restart protocol: executor/restart.py decides when, how often and by which
    # deadline; only these methods (and the backend's start_incarnation) touch the
    # incarnation's state.  Callers hold ``restart_lock``.

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
        """The old incarnation's failure is handled in full (whichever thread handles it),
        its workers are stopped and released, its failure thread done."""
        self._wait_failure_handled()
        self._stop_workers()
        self._join_failure_thread()

    def _wait_failure_handled(self) -> None:
        """Wait (bounded) until the thread that failed us has done everything ``_fail``
        does: only then may a restart stop, replace and swap the incarnation."""
        handled = self._failure_handled
        if handled is None or self._failure_handler is threading.current_thread():
            return  # a failure callback restarting (not allowed, see restart.py): no deadlock
        bound = self.config.shutdown_grace + self.config.sigterm_grace + 10
        if not handled.wait(bound):
            log.warning("restart: the failure of incarnation %d was still being handled "
                        "after %g s; restarting anyway", self.incarnation, bound)

    def start_incarnation(self, startup_timeout: float) -> None:
        """The backend's: start new workers (READY within ``startup_timeout``), then
        ``_swap_in``; a failed start releases what it started and raises."""
        raise NotImplementedError

    def _swap_in(self, send_lock: threading.Lock, reply_lock: threading.RLock) -> None:
        """The new incarnation serves: lock order as elsewhere (send, reply, state)."""
        with send_lock, reply_lock, self._state_lock:
            if self._closed:
                raise RestartAborted("the executor was shut down while it restarted")
            self._send_lock = send_lock
            self._failure, self._failed, self._callbacks_ran = None, False, False
            self.incarnation += 1
        if self._rec.enabled:
            self._rec.event("executor.incarnation", {"faultlab.incarnation": self.incarnation,
                                                     "faultlab.worker_pids": str(self.worker_pids)})

    @property
    def worker_pids(self) -> list[int]:
        raise NotImplementedError

    # ------------------------------------------------------------------ calls

    def _check_owner(self) -> None:
        if not self._owned():
            raise ForeignProcessError(
                f"this executor belongs to process {self._owner_pid()}; process "
                f"{os.getpid()} (a fork of it) cannot use it: create an executor in the child "
                "instead"
            )

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
            self._send_request(call, parts, trace)
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

    def _refuse_after_failure(self, timeout: float | None) -> None:
        """A call refused because the executor failed comes after every earlier call: their
        futures fail first (the monitor thread may still be failing them), in order."""
        self._fail_pending()
        limit = float("inf") if timeout is None else time.monotonic() + timeout
        self._collector.settle_resolved(limit)

    def _fail(self, error: ExecutorFailedError, *, inline: bool = False) -> None:
        """Mark the executor failed (once), wake every waiter, fail every pending call, then
        stop the workers and run the failure callbacks: here when the calling thread holds
        no lock of ours (``inline``), else on a thread of their own."""
        with self._state_lock:
            if self._failure is not None:
                return
            self._failure, self._failed = error, True
            handled = self._failure_handled = threading.Event()
            self._failure_handler = threading.current_thread()
        try:
            log.error("executor failed: %s", error)
            self._wake_waiters()
            self._fail_pending()
            if not inline:
                thread = threading.Thread(target=self._after_failure, args=(handled,),
                                          name="faultlab-failure", daemon=True)
                self._failure_thread = self._failure_handler = thread
                thread.start()
                return
        except BaseException:
            handled.set()  # a Ctrl-C here: nobody will finish it, so nobody waits for it
            raise
        self._after_failure(handled)

    def _after_failure(self, handled: threading.Event | None = None) -> None:
        try:
            self._stop_workers()
            collector = getattr(self, "_collector", None)
            if collector is not None:
                collector.settle_resolved(0.0)  # a thread already settling settles them all
            self._run_callbacks()
        finally:
            if handled is not None:
                handled.set()

    def _fail_pending(self) -> None:
        """Resolve every pending call with the failure (settling is the caller's)."""
        collector = getattr(self, "_collector", None)
        failure = self._failure
        if collector is not None and failure is not None:
            for call in list(collector.pending):
                collector.resolve(call, failure.again())

    def _run_callbacks(self) -> None:
        with self._state_lock:
            if self._callbacks_ran:
                return
            self._callbacks_ran = True
            callbacks = list(self._callbacks)  # kept: a restarted executor reports its next failure too
        for callback in callbacks:
            _run_callback(callback)

    def _close(self) -> None:
        """``shutdown``'s first step: never restart again (waiting, bounded, for a restart in
        progress to see that and give up), refuse every call, drop unfired callbacks."""
        self._closed = True
        cfg = self.config
        if self.restart_lock.acquire(timeout=cfg.startup_timeout + cfg.shutdown_grace + 10):
            self.restart_lock.release()
        with self._state_lock:
            if self._failure is None:
                self._failure = ExecutorFailedError("the executor was shut down")
            if not self._failed:
                self._callbacks_ran, self._callbacks = True, []  # no failure to report, ever

    def _join_failure_thread(self) -> None:
        thread = self._failure_thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(self.config.shutdown_grace + self.config.sigterm_grace + 10)


def _run_callback(callback: FailureCallback) -> None:
    try:
        callback()
    except Exception:
        log.exception("executor failure callback raised")
