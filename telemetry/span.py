"""Span handles and the trace context that travels inside queue messages.

Data flow::

    Recorder.start_span ──► Span (sampled: writes records through its Recorder)
                       └──► NonRecordingSpan (not sampled or off: writes nothing)
    Recorder.begin_rpc ──► rpc_trace.RpcTrace  (an RPC in the driver, as plain data)
    Recorder.serve / served ──► ints            (its execution in a worker)
    span.context ──► SpanContext.to_wire ──► (trace_id, span_id, flags) ──► from_wire

An RPC's child spans are not written as spans: the driver writes its PHASES records when
the RPC ends (``telemetry.rpc_trace``: enqueue times, the RPC's attributes, dequeue times);
the worker's ``Recorder.served`` writes one PHASES record after the reply (dequeue,
execute end, reply times).  ``assemble`` expands them into ``ENQUEUE``, ``dequeue_name(r)``,
``WORKER_DEQUEUE`` and ``REPLY_ENQUEUE`` spans, with the attributes and kinds a span of
each would have had.  Failed phases (rare) are written as classic spans.

Invariants:

- Every span, recording or not, has a valid ``SpanContext`` (non-zero ids), so the
  sampled flag of a root decides for its whole trace across processes.
- A ``Span`` writes its end record at most once; later ``end`` calls do nothing.
- Wire flags are W3C trace flags: ``FLAG_SAMPLED`` (bit 0) is "sampled".  (Journal
  record flags are ``journal``'s own, with other names.)
- An RPC span's begin is its SPAN_START record, written before the request is sent (or
  the method runs), so a process that dies mid-RPC leaves it open: truncated when read.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from telemetry import journal as j

if TYPE_CHECKING:
    from types import TracebackType

    from telemetry.recorder import Recorder

_M64 = (1 << 64) - 1
FLAG_SAMPLED = 0x01  # W3C trace flag on the wire
_STATUS_OK, _SPAN_END = j.STATUS_OK, j.SPAN_END
_pack_end = j.SPAN_END_S.pack_into
_time_ns = time.time_ns
_JOURNAL_ERRORS = j.JOURNAL_ERRORS

# The names of an RPC's child spans (expanded from PHASES records by ``assemble``).
ENQUEUE = "executor.enqueue"
WORKER_DEQUEUE = "worker.dequeue"
REPLY_ENQUEUE = "worker.reply_enqueue"
QUEUE_WAIT = "faultlab.queue.wait_ns"  # worker.dequeue: the idle wait before the message


def dequeue_name(rank: int) -> str:
    return f"executor.dequeue rank {rank}"


class SpanContext(NamedTuple):
    """Identity of a span: 128-bit trace id, 64-bit span id, sampled flag."""

    trace_id: int
    span_id: int
    sampled: bool

    @staticmethod
    def to_wire(ctx: SpanContext | None) -> tuple[int, int, int] | None:
        """The small tuple that rides in a queue message (None when not tracing)."""
        if ctx is None:
            return None
        return (ctx[0], ctx[1], FLAG_SAMPLED if ctx[2] else 0)

    @staticmethod
    def from_wire(wire: tuple[int, int, int] | None) -> SpanContext | None:
        if wire is None:
            return None
        trace_id, span_id, flags = wire
        return SpanContext(trace_id, span_id, bool(flags & FLAG_SAMPLED))

    @property
    def trace_id_hex(self) -> str:
        return f"{self.trace_id:032x}"

    @property
    def span_id_hex(self) -> str:
        return f"{self.span_id:016x}"

    def traceparent(self) -> str:
        """The W3C ``traceparent`` header value for this context."""
        return f"00-{self.trace_id_hex}-{self.span_id_hex}-{1 if self.sampled else 0:02x}"


class Span:
    """A sampled span being recorded; end it exactly once (or use it as a context manager).

    Its ``context`` is built on first use: most spans are never anyone's parent.
    """

    __slots__ = ("_ctx", "_rec", "ended", "span_id", "trace_id")

    def __init__(self, rec: Recorder, trace_id: int, span_id: int) -> None:
        self._rec = rec
        self.trace_id = trace_id
        self.span_id = span_id
        self._ctx: SpanContext | None = None
        self.ended = False

    @property
    def context(self) -> SpanContext:
        ctx = self._ctx
        if ctx is None:
            ctx = self._ctx = SpanContext(self.trace_id, self.span_id, True)
        return ctx

    @property
    def is_recording(self) -> bool:
        return not self.ended

    def set_attribute(self, key: str, value: Any) -> None:
        if not self.ended:
            self._rec.write_attribute(j.OWNER_SPAN, self.span_id, key, value)

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        """Several attributes in one call (one journal record each, one call's overhead)."""
        if not self.ended:
            self._rec.write_attributes(j.OWNER_SPAN, self.span_id, attributes)

    def add_event(self, name: str, attributes: dict[str, Any] | None = None) -> None:
        if not self.ended:
            self._rec.write_event(self.span_id, name, attributes)

    def end(self, error: BaseException | str | None = None, end_ns: int | None = None) -> None:
        """End the span now, or at ``end_ns`` (``time.time_ns()``); status ERROR with a
        message when ``error`` is given."""
        if self.ended:
            return
        self.ended = True
        if error is None:  # the common case: Recorder.write_end costs a call more
            writer = self._rec.journal_writer
            if writer is None:
                return
            try:
                writer.append(_pack_end, _SPAN_END, _STATUS_OK, 0, 0, self.span_id,
                              _time_ns() if end_ns is None else end_ns)
            except _JOURNAL_ERRORS:
                pass
            return
        message = self._error_message(error)
        self._rec.write_end(self.span_id, j.STATUS_ERROR, message, 0, end_ns)

    def _error_message(self, error: BaseException | str) -> str:
        return error_message(self._rec, self.span_id, error)

    def __enter__(self) -> Span:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.end(exc)


def error_message(rec: Recorder, span_id: int, error: BaseException | str) -> str:
    """The status message of an error; an exception also gets its ``exception`` event on
    span ``span_id``."""
    if not isinstance(error, BaseException):
        return _safe_str(error)
    text = _safe_str(error)
    rec.write_event(span_id, "exception", {
        "exception.type": type(error).__qualname__,
        "exception.message": text,
        "exception.stacktrace": _stacktrace(error)[-4000:],
    })
    return f"{type(error).__name__}: {text}"


class NonRecordingSpan:
    """A span that is not sampled (or tracing is off): it has a context and records nothing."""

    __slots__ = ("_ctx", "span_id", "trace_id")
    is_recording = False
    ended = True

    def __init__(self, trace_id: int, span_id: int) -> None:
        self.trace_id = trace_id
        self.span_id = span_id
        self._ctx: SpanContext | None = None

    @property
    def context(self) -> SpanContext:
        ctx = self._ctx
        if ctx is None:
            ctx = self._ctx = SpanContext(self.trace_id, self.span_id, False)
        return ctx

    def set_attribute(self, key: str, value: Any) -> None:
        pass

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        pass

    def add_event(self, name: str, attributes: dict[str, Any] | None = None) -> None:
        pass

    def end(self, error: BaseException | str | None = None, end_ns: int | None = None) -> None:
        pass

    def __enter__(self) -> NonRecordingSpan:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        pass


def root_sampling(sampler: str, ratio: float) -> tuple[bool, int]:
    """``(follow parent?, bound)``: a span without a parent to follow is sampled iff
    ``trace_id & (2**64 - 1) < bound`` (the OpenTelemetry TraceIdRatioBased rule)."""
    parent_based = sampler.startswith("parentbased_")
    base = sampler.removeprefix("parentbased_")
    if base == "always_on":
        bound = 1 << 64
    elif base == "always_off":
        bound = 0
    else:
        bound = round(ratio * (1 << 64))
    return parent_based, bound


def _safe_str(obj: object) -> str:
    """``str(obj)``, or a note: a hostile exception must not end the process recording it."""
    try:
        return str(obj)
    except BaseException as exc:  # noqa: BLE001 - even SystemExit from a __str__
        return f"<str() of {type(obj).__qualname__} raised {type(exc).__qualname__}>"


def _stacktrace(error: BaseException) -> str:
    try:
        return "".join(traceback.format_exception(error))
    except BaseException:  # noqa: BLE001
        return ""
