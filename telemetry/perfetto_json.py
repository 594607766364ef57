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
"""

from __future__ import annotations

from typing import Any

from telemetry.assemble import ProcessInfo, RecordedSpan

_ROLE_ORDER = {"driver": 0, "chaos": 1, "worker": 2}


def _process_label(proc: ProcessInfo) -> str:
    rank = "" if proc.rank is None else f" {proc.rank}"
    return f"{proc.role}{rank} (pid {proc.pid})"


Track = tuple[int, int]  # (pid, tid) as written


def assign_tracks(spans: list[RecordedSpan]) -> dict[int, int]:
    """span id -> tid of its track: the thread's own, or an extra one where it would
    partially overlap a slice already there."""
    lanes: dict[Track, list[list[int]]] = {}  # per thread: per lane, a stack of end times
    out: dict[int, int] = {}
    for span in sorted(spans, key=lambda s: (s.start_ns, -s.shown_end_ns)):
        if span.point:
            out[span.span_id] = span.tid
            continue
        stacks = lanes.setdefault((span.process.pid, span.tid), [])
        end = span.shown_end_ns
        for k, stack in enumerate([*stacks, []]):
            while stack and stack[-1] <= span.start_ns:
                stack.pop()
            if not stack or stack[-1] >= end:
                if k == len(stacks):
                    stacks.append(stack)
                stack.append(end)
                out[span.span_id] = span.tid if k == 0 else (k << 32) | span.tid
                break
    return out


def _metadata(spans: list[RecordedSpan], tracks: dict[int, int]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    procs = sorted({s.process for s in spans},
                   key=lambda p: (_ROLE_ORDER.get(p.role, 3), p.rank or 0, p.created_ns))
    for index, proc in enumerate(procs):
        out.append({"ph": "M", "name": "process_name", "pid": proc.pid, "tid": 0,
                    "args": {"name": _process_label(proc)}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": proc.pid, "tid": 0,
                    "args": {"sort_index": index}})
    threads: dict[Track, str] = {}
    for s in spans:
        tid = tracks.get(s.span_id, s.tid)
        name = s.thread_name or f"thread {s.tid}"
        threads[(s.process.pid, tid)] = name if tid == s.tid else f"{name} (concurrent {tid >> 32})"
    for (pid, tid), name in sorted(threads.items()):
        out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                    "args": {"name": name}})
    return out


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
