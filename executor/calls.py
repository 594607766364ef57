"""Calls in flight and their replies, collected in submission order.

    collective_rpc ──► PendingCall (rpc id, replying ranks, deadline, future) ──► pending deque
                                                                                     │
    future.result() / a later blocking call ──► ReplyCollector.drain_until(call) ◄───┘
        for each pending call, oldest first:  for each replying rank: read its reply queue
            reply id < call id  → stale (its call timed out): drop it
            reply id = call id  → this call's outcome
            reply id > call id  → a reply went missing: the queue is out of sync (fatal)

Replies are collected by the caller that asks (``result()``/``exception()``, or a later
blocking call), not by a background thread: that keeps a blocking call free of thread hops.
So ``concurrent.futures.wait`` on futures nobody asks about does not make them progress.

Futures are settled (and their done-callbacks run) only by a thread that holds none of the
executor's locks: ``resolve`` marks a call done and queues it; ``settle_resolved`` settles
queued calls in order once the lock is released.  So a done-callback may call the executor.

Settling in order takes more than an ordered queue: the monitor thread (failing every call
at a worker's death), the failure thread and the callers all resolve and settle, and a
thread preempted between taking a call off the queue and settling it let another settle a
later call first (a SIGKILLed worker under load: futures-then-kill's [order] flake).  So a
call joins the queue in the same step that marks it done (under ``resolve_lock``: the queue
is in submission order), and one thread at a time settles (``settle_lock``, re-entrant for
a done-callback that calls the executor); a waiter whose call is done but not yet settled
waits for its turn there instead of settling it out of turn.

Invariants:
- Only the thread holding ``lock`` reads reply queues or pops ``pending``; replies are
  consumed strictly in order, so each future gets exactly its own call's outcome.
- A reply is recorded (``call.outcomes``) before its reader is ``ack()``ed, and a call is
  marked done before anything else happens to it: a KeyboardInterrupt at any instant
  leaves the collector where the next drain resumes (an interrupted call stays pending and
  is collected, and its replies dropped, by whoever drains next).
- A call's deadline bounds every wait made for it; a waiter's own limit (a blocking call's
  deadline, ``result(timeout)``) bounds waits made for earlier calls too.
- A call resolved early (timed out, or failed by the executor) still has its replies read
  when they come, and dropped, so later calls stay in step.
- Futures settle in submission order, whichever threads resolve and settle them: when a
  future is settled, every earlier future is.

Interrupts and the collector's lock.  CPython raises a pending KeyboardInterrupt right after
a call returns (and on backward jumps), so in ``if lock.acquire(t): try: ...`` it can land
after ``acquire`` returned True and before the ``try``: the lock stays held for good and
every later call of the executor blocks or times out.  So ``lock`` is an ``RLock``, the
acquire sits inside the ``try``, and the ``finally`` is one C call, ``release()``, that
releases exactly when this thread holds it (``RuntimeError`` otherwise).  A thread that
already holds the lock (an aggregator or a done-callback calling the executor) never
re-enters the drain.  chaos/interrupt_sweep.py raises KeyboardInterrupt at every such point
of a call and checks that no lock stays held.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from types import TracebackType
from typing import Any

from executor import failpoints
from executor.config import MAX_TIMEOUT_S
from executor.errors import (
    CorruptMessageError,
    ExecutorFailedError,
    QueueCorruptedError,
    ReplyUnpicklingError,
    WorkerError,
    describe,
)
from executor.protocol import FATAL, REPLY_OK, RemoteError
from executor.serialization import decode, peek
from executor.transport import MessageReader
from telemetry import rpc_trace
from telemetry.rpc_trace import RpcTrace

_NO_LIMIT = float("inf")
_time_ns = time.time_ns


@dataclasses.dataclass(eq=False)
class PendingCall:
    rpc_id: int
    method: str
    ranks: list[int]  # the ranks that reply, in rank order
    unique: bool  # unique_reply_rank was given: the result is that rank's value, not a list
    timeout: float | None
    deadline: float  # monotonic; inf when the call has no timeout
    future: RpcFuture | None  # None for a blocking call: its caller reads value/error itself
    aggregator: Callable[[list[Any]], Any] | None = None
    outcomes: list[tuple[bool, Any]] = dataclasses.field(default_factory=list)
    trace: RpcTrace | None = None  # the RPC's trace, when recorded (telemetry.rpc_trace)
    # Set once, under the collector's ``resolve_lock``: the collector, a blocking caller whose
    # deadline passed and a failing executor may all try to resolve a call at the same time.
    done: bool = False
    # A blocking call whose caller was interrupted (Ctrl-C): nobody can see its result, so its
    # replies are read to stay in step but never unpickled (that may have side effects).
    abandoned: bool = False
    value: Any = None
    error: BaseException | None = None

    def outcome(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.value


class RpcFuture(Future[Any]):
    """A concurrent Future whose ``result``/``exception`` collect replies in order.

    It is RUNNING from the start (the request is already with the workers), so ``cancel()``
    returns False, as for any call that is under way."""

    def __init__(self, collector: ReplyCollector) -> None:
        super().__init__()
        self.set_running_or_notify_cancel()
        self._collector = collector
        self.call: PendingCall | None = None

    def result(self, timeout: float | None = None) -> Any:
        self._wait(timeout)
        return super().result(timeout=0)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._wait(timeout)
        return super().exception(timeout=0)

    def _wait(self, timeout: float | None) -> None:
        limit = _limit(timeout)
        call = self.call
        if call is not None and not call.done:
            self._collector.drain_until(call, limit)
        # Resolved (maybe by another thread), not yet settled: earlier futures first; settled
        # here only if it never joined the queue (an interrupt between resolve's two steps).
        if call is not None and call.done and not self.done() \
                and self._collector.settle_resolved(limit) and not self.done():
            settle(self, result=call.value, error=call.error)


def _limit(timeout: float | None) -> float:
    """``result(timeout)``'s monotonic limit; a bad timeout is the caller's error, at once."""
    if timeout is None:
        return _NO_LIMIT
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or math.isnan(timeout):
        raise ValueError(f"timeout must be a number of seconds or None, got {timeout!r}")
    return time.monotonic() + min(max(timeout, 0.0), MAX_TIMEOUT_S)


def settle(future: Future[Any], *, result: Any = None, error: BaseException | None = None) -> None:
    """Resolve ``future`` unless something already did."""
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
    except InvalidStateError:
        pass


class ReplyCollector:
    def __init__(
        self,
        readers: list[MessageReader],
        lock: threading.RLock,
        failure: Callable[[], ExecutorFailedError | None],
        fail: Callable[[ExecutorFailedError], None],
        on_resolved: Callable[[PendingCall, BaseException | None], None],
        recorder: Any = None,
    ) -> None:
        self.recorder = recorder  # telemetry's recorder; used only for calls that carry a span
        self.readers = readers
        self.pending: collections.deque[PendingCall] = collections.deque()
        self.lock = lock
        self._failure = failure
        self._fail = fail
        self._on_resolved = on_resolved
        self._resolved: collections.deque[PendingCall] = collections.deque()  # to settle, in order
        self.resolve_lock = threading.Lock()  # guards every call's done/value/error transition
        self.settle_lock = threading.RLock()  # one settler at a time: futures settle in order

    def drain_until(self, call: PendingCall, limit: float) -> None:
        """Collect replies, oldest call first, until ``call`` resolves or ``limit`` passes."""
        if self.lock._is_owned():  # type: ignore[attr-defined]  # re-entered (an aggregator calling us)
            return
        try:  # the acquire is inside the try: see "Interrupts and the collector's lock" above
            if self._acquire(limit):
                self._drain(lambda: not call.done, limit)
        finally:
            try:
                self.lock.release()  # one C call: releases exactly when this thread holds it
            except RuntimeError:
                pass  # not acquired (limit passed, or interrupted while waiting)
        self.settle_resolved(limit)

    def collect_available(self) -> bool:
        """Collect the replies already there, without waiting; False if none (or busy).

        The rpc queue's writer calls this while it waits for a free chunk: a worker blocked
        on its full reply queue stops reading requests, so replies must be drained then."""
        if self.lock._is_owned():  # type: ignore[attr-defined]  # this thread is draining already
            return False
        before = after = (0, 0)
        try:
            if self.lock.acquire(blocking=False):
                before = len(self.pending), len(self.pending[0].outcomes) if self.pending else 0
                self._drain(lambda: True, time.monotonic())
                after = len(self.pending), len(self.pending[0].outcomes) if self.pending else 0
        finally:
            try:
                self.lock.release()
            except RuntimeError:
                pass  # another thread holds it
        return before != after

    def _drain(self, wanted: Callable[[], bool], limit: float) -> None:
        """Collect pending calls in order while ``wanted()``; the caller holds ``lock``."""
        try:
            self._drain_locked(wanted, limit)
        except BaseException as exc:  # Ctrl-C, MemoryError while assembling a reply, ...
            # The frames it left would keep views of the shared-memory rings alive (the
            # caller may keep the exception): the rings could then never be unmapped.
            drop_locals(exc.__traceback__)
            raise

    def _drain_locked(self, wanted: Callable[[], bool], limit: float) -> None:
        try:
            failure = self._failure()
            if failure is not None:  # the queues may already be closed: never touch them
                self.fail_all(failure)
                return
            while wanted() and self.pending:
                if not self._collect(self.pending[0], limit):
                    return
                self.pending.popleft()
        except ExecutorFailedError as exc:
            self.fail_all(exc)
        except QueueCorruptedError as exc:
            failure = ExecutorFailedError(f"reply queue damaged: {exc}")
            self._fail(failure)
            self.fail_all(failure)

    def _acquire(self, limit: float) -> bool:
        if limit == _NO_LIMIT:
            return self.lock.acquire()
        return self.lock.acquire(timeout=max(0.0, limit - time.monotonic()))

    def fail_all(self, error: ExecutorFailedError) -> None:
        """Fail every pending call (they are dropped: the executor is dead)."""
        while self.pending:
            call = self.pending[0]
            if not call.done:
                self.resolve(call, error.again())
            self.pending.popleft()

    def _collect(self, call: PendingCall, limit: float) -> bool:
        """Read the call's remaining replies; False if ``limit`` passed before its deadline."""
        deadline = min(call.deadline, limit)
        while len(call.outcomes) < len(call.ranks):
            rank = call.ranks[len(call.outcomes)]
            trace = call.trace
            if trace is None:
                outcome = self._read_reply(rank, call, deadline)
            else:  # its dequeue span: a good reply's rank and times (telemetry.rpc_trace)
                start_ns = _time_ns()
                try:
                    outcome = self._read_reply(rank, call, deadline)
                except BaseException as exc:
                    rpc_trace.dequeue_failed(self.recorder, trace, rank, start_ns, exc)
                    raise
                if outcome is not None and outcome[0]:
                    trace += (rank, start_ns, _time_ns())
                elif outcome is not None:  # an error reply: a dequeue span at once
                    rpc_trace.dequeue_failed(self.recorder, trace, rank, start_ns, outcome[1])
            if outcome is None:
                if time.monotonic() < call.deadline:
                    return False  # only the caller's limit passed: the reply may still come
                if trace is not None:  # the call's own deadline passed: a timed-out dequeue
                    rpc_trace.dequeue_failed(self.recorder, trace, rank, start_ns, None,
                                             timed_out=True)
                self.resolve(call, self.timeout_error(call, rank))
                return True
            call.outcomes.append(outcome)
            self.readers[rank].ack()  # after the append: an interrupt in between loses nothing
        if not call.done:
            self._resolve_outcomes(call)
        return True

    def _read_reply(self, rank: int, call: PendingCall, deadline: float) -> tuple[bool, Any] | None:
        reader = self.readers[rank]
        while True:
            if failpoints.ACTIVE:
                failpoints.fire("driver.before_dequeue", rank=rank, msg_id=call.rpc_id)
            try:
                got = reader.read(None if deadline == _NO_LIMIT else deadline, hold=True)
            except CorruptMessageError as exc:
                if exc.msg_id < call.rpc_id:
                    reader.ack()
                    continue
                return False, exc.for_rank(rank)
            if got is None:
                return None
            msg_id, frame = got
            if failpoints.ACTIVE:
                failpoints.fire("driver.after_dequeue", rank=rank, msg_id=msg_id)
            kind, _ = peek(frame)
            if kind == FATAL:
                raise self._fatal(rank, frame)
            if msg_id < call.rpc_id:
                reader.ack()
                continue  # the reply of a call that already timed out (or was interrupted)
            if msg_id > call.rpc_id:
                raise QueueCorruptedError(
                    f"rank {rank} replied to call {msg_id} while call {call.rpc_id} was due: "
                    "a reply went missing"
                )
            if call.abandoned:
                return True, None
            return self._decode(rank, call, kind, frame)

    @staticmethod
    def _decode(rank: int, call: PendingCall, kind: int, frame: bytes | bytearray) -> tuple[bool, Any]:
        try:
            value = decode(frame)
        except KeyboardInterrupt:
            raise  # Ctrl-C while unpickling: the reply stays held and is decoded again later
        except BaseException as exc:  # noqa: BLE001 - e.g. sys.exit in a __reduce__: never escapes
            error = ReplyUnpicklingError(
                f"the reply of rank {rank} to {call.method!r} (rpc {call.rpc_id}) arrived "
                f"but could not be unpickled in the driver: {describe(exc)}"
            )
            error.__cause__ = exc
            return False, error
        if kind == REPLY_OK:
            return True, value
        return False, _worker_error(rank, call.method, value)

    def _fatal(self, rank: int, frame: bytes | bytearray) -> ExecutorFailedError:
        try:
            remote: RemoteError = decode(frame)
            what = remote.message
        except Exception:  # noqa: BLE001
            what = "its queue was damaged"
        error = ExecutorFailedError(f"worker rank {rank} stopped: {what}")
        self._fail(error)
        return error

    @staticmethod
    def timeout_error(call: PendingCall, rank: int) -> TimeoutError:
        return TimeoutError(
            f"collective_rpc({call.method!r}) timed out after {call.timeout:g} s "
            f"(rpc {call.rpc_id}) waiting for the reply of rank {rank}"
        )

    def _resolve_outcomes(self, call: PendingCall) -> None:
        errors = [value for ok, value in call.outcomes if not ok]
        if errors:
            self.resolve(call, errors[0])
            return
        values = [value for _, value in call.outcomes]
        if call.unique:
            result = values[0]
        elif call.aggregator is None:
            result = values
        else:
            try:
                result = call.aggregator(values)
            except Exception as exc:  # noqa: BLE001 - the aggregator's error is this call's only
                self.resolve(call, exc)
                return
        self.resolve(call, None, result)

    def resolve(self, call: PendingCall, error: BaseException | None, result: Any = None) -> None:
        """Mark ``call`` done (the first outcome wins); its future is settled later, outside
        every lock.  Any thread may call this, holding the collector's lock or not."""
        with self.resolve_lock:
            if call.done:
                return
            call.value, call.error, call.done = result, error, True  # one statement, no call
            if call.future is not None:  # queued as it is marked done: the queue stays in order
                self._resolved.append(call)
        self._on_resolved(call, error)

    def settle_resolved(self, limit: float = _NO_LIMIT) -> bool:
        """Settle resolved futures in order; the caller holds no executor lock, since their
        done-callbacks may call the executor.  Waits until ``limit`` (monotonic; 0: not at
        all) for a thread that is settling: False if the queue was left to it (it looks
        again once it lets go, so nothing queued is left behind)."""
        while self._resolved:  # the common case, nothing to settle, raises nothing (~1 µs less)
            try:  # the acquire is inside the try, as in drain_until
                if not self._acquire_settle(limit):
                    return False
                self._settle_queued()
            finally:
                try:
                    self.settle_lock.release()
                except RuntimeError:
                    pass  # not acquired
        return True

    def _acquire_settle(self, limit: float) -> bool:
        if limit == _NO_LIMIT:
            return self.settle_lock.acquire()
        return self.settle_lock.acquire(timeout=max(0.0, limit - time.monotonic()))

    def _settle_queued(self) -> None:
        """Settle the queue's calls, oldest first; the caller holds ``settle_lock``.  A call
        leaves the queue after it is settled (settling twice does nothing): a done-callback
        that calls the executor settles the next ones itself, on this thread."""
        resolved = self._resolved
        while resolved:
            call = resolved[0]
            assert call.future is not None
            if failpoints.ACTIVE:
                failpoints.fire("driver.before_settle", msg_id=call.rpc_id)
            settle(call.future, result=call.value, error=call.error)
            if resolved and resolved[0] is call:  # a nested settle may have taken it already
                resolved.popleft()


def drop_locals(tb: TracebackType | None) -> None:
    """Clear the locals of every finished frame below the first in ``tb`` (the traceback
    still shows where it happened): a queue end's frames may hold slices of a ring (a
    signal lands at the first bytecode after a C call, e.g. inside ``shm_ring.digest``),
    and an exception the caller keeps must not keep the ring mapped (and its memfd open)."""
    tb = tb.tb_next if tb is not None else None
    while tb is not None:
        try:
            tb.tb_frame.clear()
        except RuntimeError:  # still executing: not ours to clear
            pass
        tb = tb.tb_next


def _worker_error(rank: int, method: str, remote: RemoteError) -> WorkerError:
    return WorkerError(
        f"rank {rank}: {method!r} raised {remote.type_name}: {remote.message}",
        rank=rank,
        exc_type=remote.type_name,
        exc_message=remote.message,
        remote_traceback=remote.traceback,
    )
