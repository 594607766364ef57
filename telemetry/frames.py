"""A recorded run as pandas DataFrames, for notebooks, chaos invariants and plots.

Data flow::

    run_dir/journal-*.bin ──► assemble.read_run ──► list[RecordedSpan] ──► load_run (spans)
                                                                     └──► load_events (events)

Columns of ``load_run`` (one row per span, sorted by ``start_ns``): ``name, trace_id,
span_id, parent_span_id`` (lowercase hex as in OTLP/Jaeger; ``parent_span_id`` is None for
a root), ``pid, rank`` (nullable Int64), ``role, service, tid, thread_name, start_ns,
end_ns`` (nullable Int64; null for a span its process never ended), ``duration_ns,
last_seen_ns, status`` (``UNSET``/``OK``/``ERROR``), ``status_message, truncated, point``
(zero-length process-life spans), ``attributes`` (dict), ``events`` (list of dicts).

Columns of ``load_events`` (one row per span event and per point span): ``name, time_ns,
span_id, trace_id, span_name, source`` (``event``/``point``), ``attributes, pid, rank,
role``.
"""

from __future__ import annotations

import os
from typing import Any

import pandas as pd

from telemetry.assemble import RecordedSpan, read_run

SPAN_COLUMNS = [
    "name", "trace_id", "span_id", "parent_span_id", "pid", "rank", "role", "service",
    "tid", "thread_name", "start_ns", "end_ns", "duration_ns", "last_seen_ns", "status",
    "status_message", "truncated", "stopped", "point", "attributes", "events",
]
EVENT_COLUMNS = [
    "name", "time_ns", "span_id", "trace_id", "span_name", "source", "attributes",
    "pid", "rank", "role",
]
_INT_COLUMNS = (
    "pid", "rank", "tid", "start_ns", "end_ns", "duration_ns", "last_seen_ns", "time_ns",
)


def span_row(span: RecordedSpan) -> dict[str, Any]:
    proc = span.process
    return {
        "name": span.name,
        "trace_id": f"{span.trace_id:032x}",
        "span_id": f"{span.span_id:016x}",
        "parent_span_id": f"{span.parent_span_id:016x}" if span.parent_span_id else None,
        "pid": proc.pid, "rank": proc.rank, "role": proc.role, "service": proc.service,
        "tid": span.tid, "thread_name": span.thread_name,
        "start_ns": span.start_ns, "end_ns": span.end_ns,
        "duration_ns": None if span.end_ns is None else span.end_ns - span.start_ns,
        "last_seen_ns": span.last_seen_ns,
        "status": span.status, "status_message": span.status_message,
        "truncated": span.truncated, "stopped": span.stopped, "point": span.point,
        "attributes": dict(span.attributes),
        "events": [
            {"name": e.name, "time_ns": e.time_ns, "attributes": dict(e.attributes)}
            for e in span.events
        ],
    }


def _frame(rows: list[dict[str, Any]], columns: list[str], sort_by: str) -> pd.DataFrame:
    """Build column by column: nullable ints must not pass through float64 (ns overflow it)."""
    data: dict[str, Any] = {}
    for column in columns:
        values = [row[column] for row in rows]
        if column in _INT_COLUMNS:
            data[column] = pd.array(values, dtype="Int64")
        elif column in ("truncated", "stopped", "point"):
            data[column] = pd.array(values, dtype=bool)
        else:
            data[column] = pd.Series(values, dtype=object)
    frame = pd.DataFrame(data, columns=columns)
    return frame.sort_values(sort_by, kind="stable").reset_index(drop=True)


def spans_frame(spans: list[RecordedSpan]) -> pd.DataFrame:
    return _frame([span_row(s) for s in spans], SPAN_COLUMNS, "start_ns")


def load_run(run_dir: str | os.PathLike[str]) -> pd.DataFrame:
    """One row per span of every process journal in ``run_dir``."""
    return spans_frame(read_run(run_dir))


def event_rows(spans: list[RecordedSpan]) -> list[dict[str, Any]]:
    rows = []
    for span in spans:
        proc = span.process
        common = {
            "trace_id": f"{span.trace_id:032x}", "pid": proc.pid, "rank": proc.rank,
            "role": proc.role,
        }
        if span.point:
            rows.append({
                "name": span.name, "time_ns": span.start_ns, "span_id": f"{span.span_id:016x}",
                "span_name": span.name, "source": "point", "attributes": dict(span.attributes),
                **common,
            })
        for event in span.events:
            rows.append({
                "name": event.name, "time_ns": event.time_ns,
                "span_id": f"{span.span_id:016x}", "span_name": span.name, "source": "event",
                "attributes": dict(event.attributes), **common,
            })
    return rows


def load_events(run_dir: str | os.PathLike[str]) -> pd.DataFrame:
    """Span events (``chaos.fault``, ``exception``...) and point spans (process life)."""
    return _frame(event_rows(read_run(run_dir)), EVENT_COLUMNS, "time_ns")
