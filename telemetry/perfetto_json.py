"""A recorded run as Chrome trace-event JSON, which Perfetto UI and chrome://tracing open.

Data flow::

    list[RecordedSpan] ──► {"traceEvents": [M process/thread names, X spans, i events]}

One track per process (``pid``) and thread (``tid``, the native thread id); slices that
overlap without nesting on one thread (concurrent RPCs: futures, async scheduling) go to
extra tracks of that thread, ``(k << 32) | tid``, named "<thread> (concurrent k)", so no
two slices of a track partially overlap.  Spans are complete ("X") events; an open
(truncated) span lasts until its process's best-known death and has ``args.truncated``;
span events (faults, detections, exceptions) and point spans (process life) are instant
("i") events.  A parent in another process is drawn as a flow arrow ("s" on the parent's
track, "f" on the child's, both at the child's start).  Times are microseconds since the run's first record
(``otherData.t0_unix_ns``): absolute epoch microseconds would lose sub-µs precision.

``write_perfetto`` writes the same events from a stream of traces (``telemetry.stream``,
in order of their first start), holding only the traces that overlap in time: spans wait
in a heap until no later trace can start before them, then get their tracks in
``assign_tracks``'s order (start, longest first); a trace's events are written once all of
its spans have a track.  The metadata (process and thread names) comes last; flow ids
differ from ``to_perfetto``'s, the events are the same.
"""

from __future__ import annotations

import heapq
import itertools
import json
from collections.abc import Iterable
from typing import Any, TextIO

from telemetry.assemble import ProcessInfo, RecordedSpan

_ROLE_ORDER = {"driver": 0, "chaos": 1, "worker": 2}


def _process_label(proc: ProcessInfo) -> str:
    rank = "" if proc.rank is None else f" {proc.rank}"
    return f"{proc.role}{rank} (pid {proc.pid})"


Track = tuple[int, int]  # (pid, tid) as written


class _Lanes:
    """``assign_tracks``'s lane stacks, fed spans one at a time in (start, -end) order."""

    def __init__(self) -> None:
        self.stacks: dict[Track, list[list[int]]] = {}

    def track(self, span: RecordedSpan) -> int:
        if span.point:
            return span.tid
        stacks = self.stacks.setdefault((span.process.pid, span.tid), [])
        end = span.shown_end_ns
        for k, stack in enumerate([*stacks, []]):
            while stack and stack[-1] <= span.start_ns:
                stack.pop()
            if not stack or stack[-1] >= end:
                if k == len(stacks):
                    stacks.append(stack)
                stack.append(end)
                return span.tid if k == 0 else (k << 32) | span.tid
        raise AssertionError("unreachable: the last, empty lane always takes the span")


def assign_tracks(spans: list[RecordedSpan]) -> dict[int, int]:
    """span id -> tid of its track: the thread's own, or an extra one where it would
    partially overlap a slice already there."""
    lanes = _Lanes()
    return {span.span_id: lanes.track(span)
            for span in sorted(spans, key=lambda s: (s.start_ns, -s.shown_end_ns))}


def _metadata(spans: list[RecordedSpan], tracks: dict[int, int]) -> list[dict[str, Any]]:
    threads: dict[Track, str] = {}
    for s in spans:
        tid = tracks.get(s.span_id, s.tid)
        name = s.thread_name or f"thread {s.tid}"
        threads[(s.process.pid, tid)] = name if tid == s.tid else f"{name} (concurrent {tid >> 32})"
    return _metadata_events(list({s.process for s in spans}), threads)


def _flows(spans: list[RecordedSpan], tracks: dict[int, int], t0: int) -> list[dict[str, Any]]:
    """A flow arrow from each cross-process parent to its child."""
    by_id = {(s.trace_id, s.span_id): s for s in spans}
    out: list[dict[str, Any]] = []
    for n, span in enumerate(s for s in spans if s.parent_span_id and s.parent_remote):
        parent = by_id.get((span.trace_id, span.parent_span_id))
        if parent is None or parent.process.pid == span.process.pid:
            continue
        ts = (span.start_ns - t0) / 1000
        common = {"name": "parent", "cat": "flow", "id": n + 1, "ts": ts}
        out.append({"ph": "s", "pid": parent.process.pid,
                    "tid": tracks.get(parent.span_id, parent.tid), **common})
        out.append({"ph": "f", "bp": "e", "pid": span.process.pid,
                    "tid": tracks.get(span.span_id, span.tid), **common})
    return out


def _span_event(span: RecordedSpan, t0: int, tid: int) -> dict[str, Any]:
    end_ns = span.shown_end_ns
    args: dict[str, Any] = {"kind": span.kind,
        "trace_id": f"{span.trace_id:032x}", "span_id": f"{span.span_id:016x}",
        "status": span.status, **{k: v for k, v in span.attributes.items()},
    }
    if span.parent_span_id:
        args["parent_span_id"] = f"{span.parent_span_id:016x}"
    if span.status_message:
        args["status_message"] = span.status_message
    if span.truncated:
        args["truncated"] = True
        args["truncated_reason"] = span.truncated_reason
    return {
        "ph": "X", "name": span.name, "cat": span.process.role, "pid": span.process.pid,
        "tid": tid, "ts": (span.start_ns - t0) / 1000,
        "dur": (end_ns - span.start_ns) / 1000, "args": args,
    }


def _instant(name: str, time_ns: int, span: RecordedSpan, t0: int,
             attributes: dict[str, Any], tid: int) -> dict[str, Any]:
    return {
        "ph": "i", "s": "t", "name": name, "cat": "event", "pid": span.process.pid,
        "tid": tid, "ts": (time_ns - t0) / 1000,
        "args": {"span_id": f"{span.span_id:016x}", **attributes},
    }


def to_perfetto(spans: list[RecordedSpan]) -> dict[str, Any]:
    t0 = min((s.start_ns for s in spans), default=0)
    tracks = assign_tracks(spans)
    events = _metadata(spans, tracks)
    for span in sorted(spans, key=lambda s: s.start_ns):
        tid = tracks.get(span.span_id, span.tid)
        if span.point:
            events.append(_instant(span.name, span.start_ns, span, t0, span.attributes, tid))
            continue
        events.append(_span_event(span, t0, tid))
        events.extend(_instant(e.name, e.time_ns, span, t0, e.attributes, tid)
                      for e in span.events)
    events.extend(_flows(spans, tracks, t0))
    return {"traceEvents": events, "displayTimeUnit": "ns", "otherData": {"t0_unix_ns": t0}}


class PerfettoWriter:
    """Writes trace events as traces arrive (in order of their first start)."""

    def __init__(self, out: TextIO, t0: int) -> None:
        self.out, self.t0 = out, t0
        self.count = 0  # spans written
        self._lanes = _Lanes()
        self._heap: list[tuple[int, int, int, RecordedSpan]] = []
        self._seq = itertools.count()
        self._pending: list[list[Any]] = []  # [spans, spans without a track yet, tracks]
        self._trace_of: dict[int, list[Any]] = {}  # heap seq -> its pending trace
        self._procs: dict[ProcessInfo, None] = {}
        self._threads: dict[Track, str] = {}
        self._flow_ids = itertools.count(1)
        self._sep = ""
        out.write('{"traceEvents":[')

    def add(self, spans: list[RecordedSpan]) -> None:
        if not spans:
            return
        # Traces come in order of their first start's µs: no later span starts before it.
        self._assign_before(min(s.start_ns for s in spans) // 1000 * 1000)
        entry: list[Any] = [spans, len(spans), {}]
        self._pending.append(entry)
        for span in spans:
            seq = next(self._seq)
            self._trace_of[seq] = entry
            heapq.heappush(self._heap, (span.start_ns, -span.shown_end_ns, seq, span))
        self._emit_ready()

    def close(self) -> None:
        self._assign_before(None)
        self._emit_ready()
        events = _metadata_events(list(self._procs), self._threads)
        self._write(events)
        self.out.write(f'],"displayTimeUnit":"ns","otherData":{{"t0_unix_ns":{self.t0}}}}}')

    def _assign_before(self, start: int | None) -> None:
        heap = self._heap
        while heap and (start is None or heap[0][0] < start):
            _, _, seq, span = heapq.heappop(heap)
            entry = self._trace_of.pop(seq)
            entry[2][span.span_id] = self._lanes.track(span)
            entry[1] -= 1

    def _emit_ready(self) -> None:
        done = 0
        for spans, waiting, tracks in self._pending:
            if waiting:
                break
            done += 1
            self._write(self._trace_events(spans, tracks))
            self.count += len(spans)
        del self._pending[:done]

    def _trace_events(self, spans: list[RecordedSpan], tracks: dict[int, int]) -> list[Any]:
        events: list[dict[str, Any]] = []
        for span in sorted(spans, key=lambda s: s.start_ns):
            tid = tracks.get(span.span_id, span.tid)
            self._procs.setdefault(span.process)
            name = span.thread_name or f"thread {span.tid}"
            self._threads[(span.process.pid, tid)] = \
                name if tid == span.tid else f"{name} (concurrent {tid >> 32})"
            if span.point:
                events.append(_instant(span.name, span.start_ns, span, self.t0,
                                       span.attributes, tid))
                continue
            events.append(_span_event(span, self.t0, tid))
            events.extend(_instant(e.name, e.time_ns, span, self.t0, e.attributes, tid)
                          for e in span.events)
        flows = _flows(spans, tracks, self.t0)
        for start in range(0, len(flows), 2):  # a pair per arrow: ids unique in the file
            flow_id = next(self._flow_ids)
            flows[start]["id"] = flows[start + 1]["id"] = flow_id
        events.extend(flows)
        return events

    def _write(self, events: list[dict[str, Any]]) -> None:
        if events:  # one write and one encoder call per trace: the list's text, unbracketed
            self.out.write(self._sep + json.dumps(events, separators=(",", ":"))[1:-1])
            self._sep = ","


def _metadata_events(procs: list[ProcessInfo], threads: dict[Track, str]) -> list[Any]:
    out: list[dict[str, Any]] = []
    ordered = sorted(procs, key=lambda p: (_ROLE_ORDER.get(p.role, 3), p.rank or 0, p.created_ns))
    for index, proc in enumerate(ordered):
        out.append({"ph": "M", "name": "process_name", "pid": proc.pid, "tid": 0,
                    "args": {"name": _process_label(proc)}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": proc.pid, "tid": 0,
                    "args": {"sort_index": index}})
    for (pid, tid), name in sorted(threads.items()):
        out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                    "args": {"name": name}})
    return out


def write_perfetto(traces: Iterable[list[RecordedSpan]], out: TextIO, t0: int) -> int:
    """Write the trace-event document of ``traces`` (in order of their first start; ``t0``
    the run's first start) to ``out``; the span count."""
    writer = PerfettoWriter(out, t0)
    for spans in traces:
        writer.add(spans)
    writer.close()
    return writer.count
