"""A recorded run as Jaeger-UI upload JSON (the "JSON File" tab of the Jaeger search page).

Data flow::

    list[RecordedSpan] ──group by trace──► {"data": [{traceID, spans, processes}]}

Shape (what the Jaeger UI reads)::

    {"data": [{"traceID": hex32, "spans": [{"traceID", "spanID": hex16, "operationName",
      "references": [{"refType": "CHILD_OF", "traceID", "spanID"}], "startTime": µs,
      "duration": µs, "tags": [{"key", "type", "value"}], "logs": [{"timestamp": µs,
      "fields": [tags]}], "processID": "p1", "warnings": [...] | null, "flags": 1}],
      "processes": {"p1": {"serviceName", "tags": [...]}}, "warnings": null}]}

``write_jaeger`` writes the same document from a stream of traces (``telemetry.stream``),
holding one trace at a time: traces are ordered by (first start µs, trace id) in both.

Invariants: times are integer microseconds since the epoch (a duration is end minus start
in microseconds, so a log at the span's last nanosecond is inside it); a truncated span lasts until
its process's best-known death (``shown_end_ns``: the fault that killed it, else its
detected death, else its last record) and carries a warning, ``faultlab.truncated`` and
``faultlab.truncated.reason``.  Spans carry ``span.kind`` (client/server/producer/consumer);
links (fault, detection) are ``FOLLOWS_FROM`` references.  An integer beyond 2^53 (a
nanosecond timestamp) becomes a string tag: browsers would round it.  A worker's span name
ends in ``[rank N]`` and each process is its own service (``faultlab driver``, ``faultlab
worker rank N``: ``telemetry.naming``), so each timeline row says where it ran, in colour.
A failed RPC's ``story_spans`` (the victim's row, ``telemetry.failure_marks``) join its trace.
"""

from __future__ import annotations

import functools
import json
from collections import defaultdict
from collections.abc import Iterable
from typing import Any, TextIO

from telemetry.assemble import ProcessInfo, RecordedSpan
from telemetry.naming import display_name, export_attributes, instance_id, service_name
from telemetry.otel import TRUNCATED_MESSAGE, truncated_message

_MAX_SAFE_INT = (1 << 53) - 1


def tag(key: str, value: Any) -> dict[str, Any]:
    kind = type(value)  # the common exact types first: a long run has millions of tags
    if kind is str:
        return {"key": key, "type": "string", "value": value}
    if kind is int and -_MAX_SAFE_INT <= value <= _MAX_SAFE_INT:
        return {"key": key, "type": "int64", "value": value}
    if isinstance(value, bool):
        return {"key": key, "type": "bool", "value": value}
    if isinstance(value, int):
        if abs(value) > _MAX_SAFE_INT:
            return {"key": key, "type": "string", "value": str(value)}
        return {"key": key, "type": "int64", "value": value}
    if isinstance(value, float):
        return {"key": key, "type": "float64", "value": value}
    if not isinstance(value, str):
        value = json.dumps(value)
    return {"key": key, "type": "string", "value": value}


@functools.lru_cache(maxsize=4096)
def _process_tags(proc: ProcessInfo) -> list[dict[str, Any]]:
    """A process's tags (the same in every trace: computed once per process)."""
    tags = [tag("process.pid", proc.pid), tag("faultlab.role", proc.role),
            tag("faultlab.incarnation", f"{proc.incarnation:016x}"),
            tag("service.instance.id", instance_id(proc)),
            tag("service.namespace", proc.service)]
    if proc.host:
        tags.append(tag("host.name", proc.host))
    if proc.rank is not None:
        tags.append(tag("faultlab.rank", proc.rank))
    return tags


def _span_tags(span: RecordedSpan) -> list[dict[str, Any]]:
    attributes = export_attributes(span)
    tags = [tag(k, v) for k, v in attributes.items()]
    if span.kind != "internal":
        tags.append(tag("span.kind", span.kind))
    if span.failed:  # OK is UNSET; a survivor the executor stopped is no error
        tags.append(tag("otel.status_code", "ERROR"))
        tags.append(tag("error", True))
        tags.append(tag("otel.status_description",
                        truncated_message(span) if span.truncated else span.status_message))
    if span.truncated:
        tags.append(tag("faultlab.truncated", True))
        tags.append(tag("faultlab.truncated.reason", span.truncated_reason or TRUNCATED_MESSAGE))
    tags.append(tag("thread.id", span.tid))
    if span.thread_name:
        tags.append(tag("thread.name", span.thread_name))
    return tags


def jaeger_span(span: RecordedSpan, process_id: str) -> dict[str, Any]:
    trace_id = f"{span.trace_id:032x}"
    end_ns = span.shown_end_ns
    references = []
    if span.parent_span_id:
        references.append({"refType": "CHILD_OF", "traceID": trace_id,
                           "spanID": f"{span.parent_span_id:016x}"})
    references.extend({"refType": "FOLLOWS_FROM", "traceID": f"{link.trace_id:032x}",
                       "spanID": f"{link.span_id:016x}"} for link in span.links)
    logs = [
        {"timestamp": e.time_ns // 1000,
         "fields": [tag("event", e.name)] + [tag(k, v) for k, v in e.attributes.items()]}
        for e in span.events
    ]
    return {
        "traceID": trace_id, "spanID": f"{span.span_id:016x}", "flags": 1,
        "operationName": display_name(span), "references": references,
        "startTime": span.start_ns // 1000, "duration": max(0, end_ns // 1000 - span.start_ns // 1000),
        "tags": _span_tags(span), "logs": logs, "processID": process_id,
        "warnings": [truncated_message(span)] if span.truncated else None,
    }


def to_jaeger(spans: list[RecordedSpan]) -> dict[str, Any]:
    by_trace: dict[int, list[RecordedSpan]] = defaultdict(list)
    for span in spans:
        by_trace[span.trace_id].append(span)
        by_trace[span.trace_id].extend(span.story_spans)  # a failed RPC's victim rows
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
                pid: {"serviceName": service_name(proc), "tags": _process_tags(proc)}
                for proc, pid in process_ids.items()
            },
            "warnings": None,
        })
    data.sort(key=lambda t: (int(t["spans"][0]["startTime"]), t["traceID"]))
    return {"data": data}


def write_jaeger(traces: Iterable[list[RecordedSpan]], out: TextIO) -> int:
    """Write ``{"data": [...]}`` to ``out`` one trace at a time (``telemetry.stream``: in
    ``to_jaeger``'s order, so the text is ``to_jaeger``'s of the whole run); the span count."""
    out.write('{"data":[')
    sep, count = "", 0
    for spans in traces:
        for trace in to_jaeger(spans)["data"]:
            out.write(sep)
            out.write(json.dumps(trace, separators=(",", ":")))
            sep, count = ",", count + len(trace["spans"])
    out.write("]}")
    return count
