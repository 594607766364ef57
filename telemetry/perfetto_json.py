"""A recorded run as Chrome trace-event JSON, which Perfetto UI and chrome://tracing open.

Data flow::

    list[RecordedSpan] ──► {"traceEvents": [M process/thread names, X spans, i events]}

One track per process (``pid``) and thread (``tid``, the native thread id).  Spans are
complete ("X") events; an open (truncated) span lasts until its process's last record and
has ``args.truncated = true``; span events (faults, exceptions) and point spans (process
life) are instant ("i") events.  Times are microseconds since the run's first record
(``otherData.t0_unix_ns``): absolute epoch microseconds would lose sub-µs precision.
"""

from __future__ import annotations

from typing import Any

from telemetry.assemble import ProcessInfo, RecordedSpan

_ROLE_ORDER = {"driver": 0, "chaos": 1, "worker": 2}


def _process_label(proc: ProcessInfo) -> str:
    rank = "" if proc.rank is None else f" {proc.rank}"
    return f"{proc.role}{rank} (pid {proc.pid})"


def _metadata(spans: list[RecordedSpan]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    procs = sorted({s.process for s in spans},
                   key=lambda p: (_ROLE_ORDER.get(p.role, 3), p.rank or 0, p.created_ns))
    for index, proc in enumerate(procs):
        out.append({"ph": "M", "name": "process_name", "pid": proc.pid, "tid": 0,
                    "args": {"name": _process_label(proc)}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": proc.pid, "tid": 0,
                    "args": {"sort_index": index}})
    threads = {(s.process.pid, s.tid): s.thread_name for s in spans}
    for (pid, tid), name in sorted(threads.items()):
        out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                    "args": {"name": name or f"thread {tid}"}})
    return out


def _span_event(span: RecordedSpan, t0: int) -> dict[str, Any]:
    end_ns = span.end_ns if span.end_ns is not None else max(span.last_seen_ns, span.start_ns)
    args: dict[str, Any] = {
        "trace_id": f"{span.trace_id:032x}", "span_id": f"{span.span_id:016x}",
        "status": span.status, **{k: v for k, v in span.attributes.items()},
    }
    if span.parent_span_id:
        args["parent_span_id"] = f"{span.parent_span_id:016x}"
    if span.status_message:
        args["status_message"] = span.status_message
    if span.truncated:
        args["truncated"] = True
    return {
        "ph": "X", "name": span.name, "cat": span.process.role, "pid": span.process.pid,
        "tid": span.tid, "ts": (span.start_ns - t0) / 1000,
        "dur": (end_ns - span.start_ns) / 1000, "args": args,
    }


def _instant(name: str, time_ns: int, span: RecordedSpan, t0: int,
             attributes: dict[str, Any]) -> dict[str, Any]:
    return {
        "ph": "i", "s": "t", "name": name, "cat": "event", "pid": span.process.pid,
        "tid": span.tid, "ts": (time_ns - t0) / 1000,
        "args": {"span_id": f"{span.span_id:016x}", **attributes},
    }


def to_perfetto(spans: list[RecordedSpan]) -> dict[str, Any]:
    t0 = min((s.start_ns for s in spans), default=0)
    events = _metadata(spans)
    for span in sorted(spans, key=lambda s: s.start_ns):
        if span.point:
            events.append(_instant(span.name, span.start_ns, span, t0, span.attributes))
            continue
        events.append(_span_event(span, t0))
        events.extend(_instant(e.name, e.time_ns, span, t0, e.attributes) for e in span.events)
    return {"traceEvents": events, "displayTimeUnit": "ns", "otherData": {"t0_unix_ns": t0}}
