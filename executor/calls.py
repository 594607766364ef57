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

Invariants:
- Only the thread holding ``lock`` reads reply queues or pops ``pending``; replies are
  consumed strictly in order, so each future gets exactly its own call's outcome.
- A call's deadline bounds every wait made for it; a waiter's own limit (a blocking call's
  deadline, ``result(timeout)``) bounds waits made for earlier calls too.
- A call resolved early (timed out, or failed by the executor) still has its replies read
  when they come, and dropped, so later calls stay in step.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from typing import Any

from executor import failpoints
from executor.errors import (
    CorruptMessageError,
    ExecutorFailedError,
    QueueCorruptedError,
    ReplyUnpicklingError,
    WorkerError,
)
from executor.protocol import FATAL, REPLY_OK, RemoteError
from executor.serialization import decode, peek
from executor.transport import MessageReader

_NO_LIMIT = float("inf")


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
    span: Any = None  # the driver's RPC span, when tracing
    done: bool = False  # set once, by the thread holding the collector's lock (or a failure)
    value: Any = None
    error: BaseException | None = None

    def outcome(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.value


class RpcFuture(Future):
    """A concurrent Future whose ``result``/``exception`` collect replies in order."""

    def __init__(self, collector: ReplyCollector) -> None:
        super().__init__()
        self._collector = collector
        self.call: PendingCall | None = None

    def result(self, timeout: float | None = None) -> Any:
        self._wait(timeout)
        return super().result(timeout=0)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._wait(timeout)
        return super().exception(timeout=0)

    def _wait(self, timeout: float | None) -> None:
        if self.call is not None and not self.call.done:
            limit = _NO_LIMIT if timeout is None else time.monotonic() + timeout
            self._collector.drain_until(self.call, limit)


def settle(future: Future, *, result: Any = None, error: BaseException | None = None) -> None:
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
        lock: threading.Lock,
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

    def drain_until(self, call: PendingCall, limit: float) -> None:
        """Collect replies, oldest call first, until ``call`` resolves or ``limit`` passes."""
        if not self._acquire(limit):
            return
        try:
            failure = self._failure()
            if failure is not None:  # the queues may already be closed: never touch them
                self.fail_all(ExecutorFailedError(str(failure)))
                return
            while not call.done and self.pending:
                if not self._collect(self.pending[0], limit):
                    return
                self.pending.popleft()
        except ExecutorFailedError as exc:
            self.fail_all(exc)
        except QueueCorruptedError as exc:
            failure = ExecutorFailedError(f"reply queue damaged: {exc}")
            self._fail(failure)
            self.fail_all(failure)
        finally:
            self.lock.release()

    def _acquire(self, limit: float) -> bool:
        if limit == _NO_LIMIT:
            return self.lock.acquire()
        return self.lock.acquire(timeout=max(0.0, limit - time.monotonic()))

    def fail_all(self, error: ExecutorFailedError) -> None:
        """Fail every pending call (they are dropped: the executor is dead)."""
        while self.pending:
            call = self.pending.popleft()
            if not call.done:
                self.resolve(call, error)

    def _collect(self, call: PendingCall, limit: float) -> bool:
        """Read the call's remaining replies; False if ``limit`` passed before its deadline."""
        deadline = min(call.deadline, limit)
        while len(call.outcomes) < len(call.ranks):
            rank = call.ranks[len(call.outcomes)]
            if call.span is None:
                outcome = self._read_reply(rank, call, deadline)
            else:
                outcome = self._traced_read_reply(rank, call, deadline)
            if outcome is None:
                if time.monotonic() < call.deadline:
                    return False
                self.resolve(call, self.timeout_error(call, rank))
                return True
            call.outcomes.append(outcome)
        if not call.done:
            self._resolve_outcomes(call)
        return True

    def _traced_read_reply(self, rank: int, call: PendingCall, deadline: float) -> tuple[bool, Any] | None:
        span = self.recorder.start_span(f"executor.dequeue rank {rank}", call.span.context)
        try:
            outcome = self._read_reply(rank, call, deadline)
        except BaseException as exc:
            span.end(exc)
            raise
        if outcome is None:
            span.set_attribute("faultlab.outcome", "timeout")
        span.end(None if outcome is None or outcome[0] else outcome[1])
        return outcome

    def _read_reply(self, rank: int, call: PendingCall, deadline: float) -> tuple[bool, Any] | None:
        reader = self.readers[rank]
        while True:
            if failpoints.ACTIVE:
                failpoints.fire("driver.before_dequeue", rank=rank, msg_id=call.rpc_id)
            try:
                got = reader.read(None if deadline == _NO_LIMIT else deadline)
            except CorruptMessageError as exc:
                if exc.msg_id < call.rpc_id:
                    continue
                exc.rank = rank
                return False, exc
            if got is None:
                return None
            msg_id, frame = got
            if failpoints.ACTIVE:
                failpoints.fire("driver.after_dequeue", rank=rank, msg_id=msg_id)
            kind, _ = peek(frame)
            if kind == FATAL:
                raise self._fatal(rank, frame)
            if msg_id < call.rpc_id:
                continue  # the reply of a call that already timed out
            if msg_id > call.rpc_id:
                raise QueueCorruptedError(
                    f"rank {rank} replied to call {msg_id} while call {call.rpc_id} was due: "
                    "a reply went missing"
                )
            return self._decode(rank, call, kind, frame)

    @staticmethod
    def _decode(rank: int, call: PendingCall, kind: int, frame: bytes | bytearray) -> tuple[bool, Any]:
        try:
            value = decode(frame)
        except BaseException as exc:  # noqa: BLE001 - e.g. sys.exit in a __reduce__: never escapes
            error = ReplyUnpicklingError(
                f"the reply of rank {rank} to {call.method!r} (rpc {call.rpc_id}) arrived "
                f"but could not be unpickled in the driver: {type(exc).__name__}: {exc}"
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
        else:
            result = call.aggregator(values) if call.aggregator is not None else values
        self.resolve(call, None, result)

    def resolve(self, call: PendingCall, error: BaseException | None, result: Any = None) -> None:
        if call.done:
            return
        call.value, call.error, call.done = result, error, True
        self._on_resolved(call, error)
        if call.future is not None:
            settle(call.future, result=result, error=error)


def _worker_error(rank: int, method: str, remote: RemoteError) -> WorkerError:
    return WorkerError(
        f"rank {rank}: {method!r} raised {remote.type_name}: {remote.message}",
        rank=rank,
        exc_type=remote.type_name,
        exc_message=remote.message,
        remote_traceback=remote.traceback,
    )
