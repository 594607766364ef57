"""``RecordingExecutor``: a proxy that logs every call for the oracles.

    workload ── collective_rpc ──► RecordingExecutor ──► MultiprocExecutor
                                        │ CallRecord: method, args, expected, start, end,
                                        ▼ deadline, outcome, order of resolution
                                   oracles (chaos.oracles)

The proxy changes nothing the executor does; it only watches.  ``expect=`` (not passed
on) states a call's right result when ``expected_result`` cannot work it out.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from executor.protocol import method_name
from executor.surfaces import ExecutorLike

UNKNOWN: Any = type("Unknown", (), {"__repr__": lambda self: "UNKNOWN"})()


@dataclasses.dataclass
class CallRecord:
    index: int
    method: str
    args: tuple[Any, ...]
    timeout: float | None
    non_block: bool
    unique_reply_rank: int | None
    expected: Any
    start_ns: int  # wall clock, comparable with fault times from other processes
    start: float  # monotonic
    end: float | None = None
    end_ns: int | None = None
    outcome: str = "pending"  # ok | error | pending
    value: Any = None
    error_type: str = ""
    error: str = ""
    resolved_seq: int | None = None  # position in the order calls resolved
    waited_at: float | None = None  # first time the workload waited on the future
    # Declared by the workload (chaos.oracles.declared_outcomes judges them): which outcomes
    # this call may end in ("ok", error type names, "*" any non-fatal error), and the
    # invariant a wrong one breaks ("hostile", "callbacks", ...).  None: the default rules.
    expect_errors: frozenset[str] | None = None
    check: str = ""

    @property
    def deadline(self) -> float | None:
        return None if self.timeout is None else self.start + self.timeout

    def summary(self) -> dict[str, Any]:
        return {"index": self.index, "method": self.method, "args": _short(self.args),
                "timeout": self.timeout, "non_block": self.non_block,
                "unique_reply_rank": self.unique_reply_rank, "expected": _short(self.expected),
                "start_ns": self.start_ns, "end_ns": self.end_ns,
                "duration_s": None if self.end is None else round(self.end - self.start, 6),
                "outcome": self.outcome, "value": _short(self.value),
                "error_type": self.error_type, "error": self.error[:300],
                "resolved_seq": self.resolved_seq}


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def expected_result(method: Any, args: tuple[Any, ...], reply_rank: int | None,
                    world_size: int, pids: list[int]) -> Any:
    """The right result of an EchoWorker call, or UNKNOWN."""
    per_rank: Callable[[int], Any] | None = {
        "echo": lambda r: args[0] if args else UNKNOWN,
        "sleep": lambda r: args[0] if args else UNKNOWN,
        "get_rank": lambda r: r,
        "getpid": lambda r: pids[r],
        "nbytes": lambda r: len(args[0]) if args and hasattr(args[0], "__len__") else UNKNOWN,
    }.get(method) if isinstance(method, str) else None
    if per_rank is None:
        return UNKNOWN
    if reply_rank is not None:
        return per_rank(reply_rank)
    values = [per_rank(r) for r in range(world_size)]
    return UNKNOWN if UNKNOWN in values else values


def requested_error(call: CallRecord) -> str | None:
    """The error an EchoWorker call asks for by itself, with no fault: ``fail`` raises (a
    WorkerError), a ``sleep`` at least as long as its timeout times out.  ``exit`` is not
    here: a workload that ends the workers on purpose declares it (``expect_errors``)."""
    if call.method == "fail":
        return "WorkerError"
    seconds = call.args[0] if call.args else None
    if (call.method == "sleep" and call.timeout is not None
            and isinstance(seconds, (int, float)) and seconds >= call.timeout):
        return "TimeoutError"
    return None


def timed_out_as_requested(call: CallRecord) -> bool:
    """A call that asks to time out did: a TimeoutError, or a QueueFullError (which is one,
    docs/design.md), raised when its deadline passed while it waited for room in the request
    ring, the readers busy with the calls ahead of it (a 2-chunk ring, a late sleep)."""
    return requested_error(call) == "TimeoutError" and call.error_type in ("TimeoutError",
                                                                          "QueueFullError")


class RecordingExecutor:
    """Looks like the executor; records each call and each failure callback."""

    def __init__(self, executor: ExecutorLike) -> None:
        self._ex = executor
        self.calls: list[CallRecord] = []
        self.callback_times_ns: list[int] = []
        self._ids = itertools.count()
        self._order = itertools.count()
        self._lock = threading.Lock()
        executor.register_failure_callback(self._on_failure)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ex, name)

    @property
    def executor(self) -> ExecutorLike:
        return self._ex

    @property
    def worker_pids(self) -> list[int]:
        return self._ex.worker_pids

    @property
    def is_failed(self) -> bool:
        return self._ex.is_failed

    def register_failure_callback(self, callback: Callable[[], None]) -> None:
        self._ex.register_failure_callback(callback)

    def shutdown(self) -> None:
        self._ex.shutdown()

    def _on_failure(self) -> None:
        self.callback_times_ns.append(time.time_ns())

    def collective_rpc(self, method: Any, timeout: float | None = None, args: Any = (),
                       kwargs: dict[str, Any] | None = None, non_block: bool = False,
                       unique_reply_rank: int | None = None, expect: Any = UNKNOWN,
                       expect_errors: frozenset[str] | None = None, check: str = "",
                       **extra: Any) -> Any:
        record = self._record(method, timeout, tuple(args), non_block, unique_reply_rank, expect)
        record.expect_errors, record.check = expect_errors, check
        try:
            out = self._ex.collective_rpc(method, timeout, args, kwargs, non_block,
                                          unique_reply_rank, **extra)
        except BaseException as exc:
            self._finish(record, None, exc)
            raise
        if not non_block:
            self._finish(record, out, None)
            return out
        self._watch(record, out)
        return out

    def attempt(self, label: str, fn: Callable[[], Any], *, check: str,
                expect_errors: frozenset[str], expect: Any = UNKNOWN) -> Any:
        """Record something other than a call (start an executor, wait for a callback) as a
        call named ``label``; its outcome is judged like a declared call's.  Never raises
        an Exception (a BaseException such as KeyboardInterrupt passes through)."""
        record = CallRecord(next(self._ids), label, (), None, False, None, expect,
                            time.time_ns(), time.monotonic(), expect_errors=expect_errors,
                            check=check)
        with self._lock:
            self.calls.append(record)
        try:
            value = fn()
        except Exception as exc:  # noqa: BLE001 - recorded: the oracles judge it
            self._finish(record, None, exc)
            return None
        except BaseException as exc:
            self._finish(record, None, exc)
            raise
        self._finish(record, value, None)
        return value

    def _record(self, method: Any, timeout: float | None, args: tuple[Any, ...],
                non_block: bool, reply_rank: int | None, expect: Any) -> CallRecord:
        name = method_name(method)
        if expect is UNKNOWN:
            expect = expected_result(method, args, reply_rank, self._ex.world_size,
                                     self._ex.worker_pids)
        record = CallRecord(next(self._ids), name, args, timeout, non_block, reply_rank,
                            expect, time.time_ns(), time.monotonic())
        with self._lock:
            self.calls.append(record)
        return record

    def _watch(self, record: CallRecord, future: Future[Any]) -> None:
        original_result = future.result

        def result(timeout: float | None = None) -> Any:
            if record.waited_at is None:
                record.waited_at = time.monotonic()
            return original_result(timeout)

        future.result = result  # type: ignore[method-assign]
        future.add_done_callback(lambda f: self._future_done(record, f))

    def _future_done(self, record: CallRecord, future: Future[Any]) -> None:
        if future.cancelled():
            self._finish(record, None, RuntimeError("future cancelled"))
            return
        exc = Future.exception(future, timeout=0)  # the base class: never drains, never waits
        self._finish(record, None if exc else Future.result(future, timeout=0), exc)

    def _finish(self, record: CallRecord, value: Any, exc: BaseException | None) -> None:
        with self._lock:
            if record.outcome != "pending":
                return
            record.end, record.end_ns = time.monotonic(), time.time_ns()
            record.resolved_seq = next(self._order)
            if exc is None:
                record.outcome, record.value = "ok", value
            else:
                record.outcome, record.error_type = "error", type(exc).__name__
                record.error = str(exc).split("\n\nRemote traceback")[0]
                record.value = exc
