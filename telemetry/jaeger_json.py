"""A recorded run as Jaeger-UI upload JSON (the "JSON File" tab of the Jaeger search page).

Data flow::

    list[RecordedSpan] ──group by trace──► {"data": [{traceID, spans, processes}]}

Shape (what the Jaeger UI reads)::

    {"data": [{"traceID": hex32, "spans": [{"traceID", "spanID": hex16, "operationName",
      "references": [{"refType": "CHILD_OF", "traceID", "spanID"}], "startTime": µs,
      "duration": µs, "tags": [{"key", "type", "value"}], "logs": [{"timestamp": µs,
      "fields": [tags]}], "processID": "p1", "warnings": [...] | null, "flags": 1}],
      "processes": {"p1": {"serviceName", "tags": [...]}}, "warnings": null}]}

Invariants: times are integer microseconds since the epoch; a truncated span lasts until
its process's last record and carries a warning and the tag ``faultlab.truncated``.
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

from telemetry.assemble import ProcessInfo, RecordedSpan
from telemetry.otel import TRUNCATED_MESSAGE


def tag(key: str, value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"key": key, "type": "bool", "value": value}
    if isinstance(value, int):
        return {"key": key, "type": "int64", "value": value}
    if isinstance(value, float):
        return {"key": key, "type": "float64", "value": value}
    if not isinstance(value, str):
        value = json.dumps(value)
    return {"key": key, "type": "string", "value": value}


def _process_tags(proc: ProcessInfo) -> list[dict[str, Any]]:
    tags = [tag("process.pid", proc.pid), tag("faultlab.role", proc.role),
            tag("faultlab.incarnation", f"{proc.incarnation:016x}")]
    if proc.rank is not None:
        tags.append(tag("faultlab.rank", proc.rank))
    return tags


def _span_tags(span: RecordedSpan) -> list[dict[str, Any]]:
    attributes = dict(span.attributes)
    tags = [tag(k, v) for k, v in attributes.items()]
    tags.append(tag("otel.status_code", "ERROR" if span.truncated else span.status))
    if span.status == "ERROR" or span.truncated:
        tags.append(tag("error", True))
        tags.append(tag("otel.status_description",
                        TRUNCATED_MESSAGE if span.truncated else span.status_message))
    if span.truncated:
        tags.append(tag("faultlab.truncated", True))
    tags.append(tag("thread.id", span.tid))
    if span.thread_name:
        tags.append(tag("thread.name", span.thread_name))
    return tags


def jaeger_span(span: RecordedSpan, process_id: str) -> dict[str, Any]:
    trace_id = f"{span.trace_id:032x}"
    end_ns = span.end_ns if span.end_ns is not None else max(span.last_seen_ns, span.start_ns)
    references = []
    if span.parent_span_id:
        references.append({"refType": "CHILD_OF", "traceID": trace_id,
                           "spanID": f"{span.parent_span_id:016x}"})
    logs = [
        {"timestamp": e.time_ns // 1000,
         "fields": [tag("event", e.name)] + [tag(k, v) for k, v in e.attributes.items()]}
        for e in span.events
    ]
    return {
        "traceID": trace_id, "spanID": f"{span.span_id:016x}", "flags": 1,
        "operationName": span.name, "references": references,
        "startTime": span.start_ns // 1000, "duration": max(0, end_ns - span.start_ns) // 1000,
        "tags": _span_tags(span), "logs": logs, "processID": process_id,
        "warnings": [TRUNCATED_MESSAGE] if span.truncated else None,
    }


def to_jaeger(spans: list[RecordedSpan]) -> dict[str, Any]:
    by_trace: dict[int, list[RecordedSpan]] = defaultdict(list)
    for span in spans:
        by_trace[span.trace_id].append(span)
    data: list[dict[str, Any]] = []
    for trace_id, members in by_trace.items():
        members.sort(key=lambda s: s.start_ns)
        process_ids: dict[ProcessInfo, str] = {}
        for span in members:
            process_ids.setdefault(span.process, f"p{len(process_ids) + 1}")
        data.append({
            "traceID": f"{trace_id:032x}",
            "spans": [jaeger_span(s, process_ids[s.process]) for s in members],
            "processes": {
                pid: {"serviceName": proc.service, "tags": _process_tags(proc)}
                for proc, pid in process_ids.items()
            },
            "warnings": None,
        })
    data.sort(key=lambda t: int(t["spans"][0]["startTime"]))
    return {"data": data}
