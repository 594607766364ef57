"""A recorded run as pandas DataFrames, for notebooks, chaos invariants and plots.

Data flow::

    run_dir/journal-*.bin ──► stream.iter_traces (one told trace at a time)
        ──► load_run (spans: column lists, no span kept) / load_events (events)
    list[RecordedSpan] ──► spans_frame / event_rows (a run already in memory)

``load_run`` holds one trace's spans at a time besides the frame it builds; the frame of a
long run is dominated by the ``attributes`` and ``events`` columns (a dict and a list per
row): ``load_run(run_dir, columns=[...])`` builds only the columns named, so a frame of
names, ids and times stays small.

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

import array
import os
from typing import Any

import numpy as np
import pandas as pd

from telemetry.assemble import RecordedSpan

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
_FLAG_COLUMNS = ("truncated", "stopped", "point")


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
    return _columns_frame({c: [row[c] for row in rows] for c in columns}, columns, sort_by)


def _columns_frame(values: dict[str, list[Any]], columns: list[str], sort_by: str | None,
                   ) -> pd.DataFrame:
    """Build column by column: nullable ints must not pass through float64 (ns overflow it)."""
    data: dict[str, Any] = {}
    for column in columns:
        if column in _INT_COLUMNS:
            data[column] = pd.array(values[column], dtype="Int64")
        elif column in _FLAG_COLUMNS:
            data[column] = pd.array(values[column], dtype=bool)
        else:
            data[column] = pd.Series(values[column], dtype=object)
        values[column] = []  # let the list go as soon as its column is built
    frame = pd.DataFrame(data, columns=columns)
    if sort_by is None:
        return frame
    return frame.sort_values(sort_by, kind="stable").reset_index(drop=True)


def spans_frame(spans: list[RecordedSpan]) -> pd.DataFrame:
    return _frame([span_row(s) for s in spans], SPAN_COLUMNS, "start_ns")


def load_run(run_dir: str | os.PathLike[str], columns: list[str] | None = None) -> pd.DataFrame:
    """One row per span of every process journal in ``run_dir``, sorted by ``start_ns``;
    only ``columns`` (default: ``SPAN_COLUMNS``), in that order."""
    from telemetry.stream import iter_traces

    wanted = list(SPAN_COLUMNS if columns is None else columns)
    unknown = [c for c in wanted if c not in SPAN_COLUMNS]
    if unknown:
        raise ValueError(f"unknown load_run columns {unknown}; known: {', '.join(SPAN_COLUMNS)}")
    builder = _ColumnBuilder(wanted)
    for spans in iter_traces(run_dir):
        builder.add_trace(spans)
    frame = builder.frame()
    if "start_ns" not in wanted:
        return frame
    return frame.sort_values("start_ns", kind="stable").reset_index(drop=True)


class _ColumnBuilder:
    """``load_run``'s columns, appended trace by trace and kept compact: integers in
    ``array('q')`` with a null mask (no int object per value), flags in a bytearray, hex ids
    as strings shared within a trace (a trace id's, a parent's: its span's)."""

    def __init__(self, wanted: list[str]) -> None:
        self.wanted = wanted
        self.ints = {c: (array.array("q"), bytearray()) for c in wanted if c in _INT_COLUMNS}
        self.flags = {c: bytearray() for c in wanted if c in _FLAG_COLUMNS}
        self.objects: dict[str, list[Any]] = {
            c: [] for c in wanted if c not in self.ints and c not in self.flags}

    def add_trace(self, spans: list[RecordedSpan]) -> None:
        shared: dict[str, str] = {}
        for span in spans:
            row = span_row(span)
            for key in ("trace_id", "span_id", "parent_span_id"):
                text = row[key]
                if text is not None:
                    row[key] = shared.setdefault(text, text)
            for column, (values, nulls) in self.ints.items():
                value = row[column]
                values.append(0 if value is None else value)
                nulls.append(value is None)
            for column, flags in self.flags.items():
                flags.append(bool(row[column]))
            for column, objects in self.objects.items():
                objects.append(row[column])

    def frame(self) -> pd.DataFrame:
        data: dict[str, Any] = {}
        for column in self.wanted:
            if column in self.ints:
                values, nulls = self.ints[column]
                data[column] = pd.arrays.IntegerArray(
                    np.frombuffer(values, np.int64) if values else np.zeros(0, np.int64),
                    np.frombuffer(bytes(nulls), bool) if nulls else np.zeros(0, bool))
            elif column in self.flags:
                data[column] = np.frombuffer(bytes(self.flags[column]), bool) \
                    if self.flags[column] else np.zeros(0, bool)
            else:
                data[column] = pd.Series(self.objects.pop(column), dtype=object)
        return pd.DataFrame(data, columns=self.wanted)


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
    from telemetry.stream import iter_traces

    rows = [row for spans in iter_traces(run_dir) for row in event_rows(spans)]
    return _frame(rows, EVENT_COLUMNS, "time_ns")
