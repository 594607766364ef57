"""The driver's trace of one RPC, kept as plain data while the call is in flight.

Data flow::

    Recorder.begin_rpc ── SPAN_START (rpc id in it) ──► RpcTrace [trace id, span id]
    executor, request out ──► trace += (enqueue start, enqueue end, body size)
    collector, good reply ──► trace += (rank, dequeue start, dequeue end)   ranks ascending
    reply not read / error reply ──► failed_child(): a classic child span at once
    call resolved ──► end_rpc(): PH_CALL (a plain successful call to ranks 0 and 1: one
                      record ends it) | PH_SENT, PH_DEQUEUED.., PH_DONE (success) or the
                      dequeue records and SPAN_END with the error (``assemble`` expands them)

Why a list: every traced RPC runs this path, and in a running executor (three processes on
two cores) each bytecode costs about three times what it costs in a hot loop, cold in every
cache; appending a tuple to a list the executor already holds costs no call and no object
(bench/bench_rpc_tracing.py: a span object with methods here cost 1.34x the untraced call,
this 1.2x).  Everything that is not the common case goes through the general functions here.

Invariants:

- The span's start record is written before the request is sent (``begin_rpc``), so a
  driver that dies mid-RPC leaves it open (truncated), with its rpc id.
- ``end_rpc`` writes the span's end at most once per trace: the executor resolves a call once
  (``Collector.resolve``) and only then calls it.
- A trace holds the enqueue items only once the request is out: a call whose enqueue failed
  has two items (its enqueue span was written by ``failed_child``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from telemetry import journal as j
from telemetry.span import ENQUEUE, SpanContext, dequeue_name, error_message

if TYPE_CHECKING:
    from telemetry.recorder import Recorder

_PHASES, _STATUS_OK, _STATUS_ERROR = j.PHASES, j.STATUS_OK, j.STATUS_ERROR
_PH_SENT, _PH_DEQUEUED, _PH_DONE, _PH_CALL = j.PH_SENT, j.PH_DEQUEUED, j.PH_DONE, j.PH_CALL
_PH_NON_BLOCK, _PH_TIMEOUT, _PH_REPLY_RANK = j.PH_NON_BLOCK, j.PH_TIMEOUT, j.PH_REPLY_RANK
_pack_times, _pack_sent = j.PH_TIMES_S.pack_into, j.PH_SENT_S.pack_into
_MAX_PH_SIZE = j.MAX_PH_SIZE
_SEGMENT_BITS, _SLOT_MASK, _HEADER_SIZE, _RECORD_SHIFT = (
    j.SEGMENT_BITS, j.SLOT_MASK, j.HEADER_SIZE, j.RECORD_SHIFT)
_RPC_IN_START = j.RPC_ID_LIMIT  # rpc ids the start record carries (FLAG_RPC)
_JOURNAL_ERRORS = j.JOURNAL_ERRORS

# Item positions.
TRACE_ID, SPAN_ID, ENQ_START, ENQ_END, SIZE, FIRST_RANK = 0, 1, 2, 3, 4, 5


class RpcTrace(list[int]):
    """``[trace id, span id, enqueue start, enqueue end, body size, rank, dequeue start,
    dequeue end, rank, ...]`` (see the module docstring)."""

    __slots__ = ()

    @property
    def context(self) -> SpanContext:
        return SpanContext(self[TRACE_ID], self[SPAN_ID], True)


def failed_child(
    rec: Recorder, trace: RpcTrace, name: str, start_ns: int,
    error: BaseException | str | None, attributes: dict[str, Any] | None = None,
) -> None:
    """A phase of the RPC that failed (enqueue, or a reply not read or in error): a classic
    child span from ``start_ns`` to now, with the error."""
    rec.start_span(name, trace.context, attributes, start_ns).end(error)


def enqueue_failed(rec: Recorder, trace: RpcTrace, start_ns: int, error: BaseException) -> None:
    failed_child(rec, trace, ENQUEUE, start_ns, error)


def dequeue_failed(
    rec: Recorder, trace: RpcTrace, rank: int, start_ns: int,
    error: BaseException | str | None, timed_out: bool = False,
) -> None:
    """A reply not read by the deadline (``timed_out``), not read (``error``), or an error."""
    attributes = {"faultlab.outcome": "timeout"} if timed_out else None
    failed_child(rec, trace, dequeue_name(rank), start_ns, error, attributes)


def end_rpc(
    rec: Recorder, trace: RpcTrace, error: BaseException | str | None, rpc_id: int,
    non_block: bool, timeout: float | None, reply_rank: int | None,
) -> None:
    """The call is resolved (``error`` None: successfully): write what the trace holds and
    end the span.  The common case first, flat: one PH_CALL record."""
    writer = rec.journal_writer
    if writer is None:
        return
    if (error is None and len(trace) == 11 and trace[5] == 0 and trace[8] == 1
            and timeout is None and reply_rank is None and rpc_id < _RPC_IN_START):
        size = trace[SIZE]
        try:  # JournalWriter.append's steps, inline (journal's module docstring)
            idx = next(writer.slots)
            seg = idx >> _SEGMENT_BITS
            maps = writer.maps
            mm = maps[seg] if seg < len(maps) else writer.open_segment(seg)
            off = _HEADER_SIZE + ((idx & _SLOT_MASK) << _RECORD_SHIFT)
            _pack_times(mm, off + 1, _PH_NON_BLOCK if non_block else 0, _PH_CALL,
                        size if size < _MAX_PH_SIZE else _MAX_PH_SIZE, trace[SPAN_ID],
                        trace[ENQ_START], trace[ENQ_END], trace[6], trace[7], trace[9], trace[10])
            mm[off] = _PHASES
        except _JOURNAL_ERRORS:
            pass
        return
    _end_phases(rec, writer, trace, error, rpc_id, non_block, timeout, reply_rank)


def _end_phases(
    rec: Recorder, writer: Any, trace: RpcTrace, error: BaseException | str | None,
    rpc_id: int, non_block: bool, timeout: float | None, reply_rank: int | None,
) -> None:
    """``end_rpc`` of any other call: PH_SENT, the dequeue records, the end."""
    span_id = trace[SPAN_ID]
    flat = trace[FIRST_RANK:]
    try:
        if len(trace) > SIZE:
            flags = (_PH_NON_BLOCK if non_block else 0) | (0 if timeout is None else _PH_TIMEOUT)
            if reply_rank is None:
                reply_rank = -1
            else:
                flags |= _PH_REPLY_RANK
            writer.append(_pack_sent, _PHASES, flags, _PH_SENT, 0, span_id, trace[ENQ_START],
                          trace[ENQ_END], rpc_id, trace[SIZE], float(timeout or 0.0), reply_rank)
        if flat and error is None:
            _write_dequeued(writer, span_id, flat, _PH_DONE)  # PH_DONE ends the span
            return
        if flat:
            _write_dequeued(writer, span_id, flat, _PH_DEQUEUED)
    except _JOURNAL_ERRORS:
        pass
    if error is None:
        rec.write_end(span_id, _STATUS_OK, "", 0, None)
    else:
        rec.write_end(span_id, _STATUS_ERROR, error_message(rec, span_id, error), 0, None)


def _write_dequeued(writer: Any, span_id: int, flat: list[int], last: int) -> None:
    """One record per run of up to ``PH_DEQUEUE_RANKS`` ranks starting at its first; the
    last one's layout is ``last``."""
    per = j.PH_DEQUEUE_RANKS
    i = 0
    while i < len(flat):
        base = flat[i]
        times = [0] * (2 * per)
        while i < len(flat) and 0 <= flat[i] - base < per:
            k = 2 * (flat[i] - base)
            times[k], times[k + 1] = flat[i + 1], flat[i + 2]
            i += 3
        layout = last if i >= len(flat) else _PH_DEQUEUED
        writer.append(_pack_times, _PHASES, _STATUS_OK, layout, base, span_id, *times)
