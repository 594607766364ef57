"""Failure timelines and detection latencies of a recorded run, drawn with matplotlib.

Data flow::

    run_dir ─► telemetry.load_run ──► spans ─┬──────────────────────► plot_timeline ─► Axes
           └─► telemetry.load_events ► events ┤ (or events_from_spans)      ▲
                                              └─► fault_detections ─────────┘
                                                        └─► detection_latencies ─► DataFrame

Faults and detections are read from the traces: ``telemetry.story`` tells each fault's
detection into the run (``faultlab.detection`` span events, keyed by the fault's span id),
and ``fault_detections`` takes it from there; for frames without them (built by hand) it
pairs faults and signs itself, by the same rule.

A *fault* is a ``chaos.fault`` point span (its time is ``chaos.time_ns``, when chaos acted; its
victim is ``process.pid`` / ``faultlab.rank``).  Its *detection* is the first sign, after
the fault, that the driver noticed: an ``executor.worker_death`` of the victim (at its
``faultlab.detected_ns``), or the first error an RPC raised (an ``exception`` event, e.g.
the ``TimeoutError`` of a deadline).  A fault nobody noticed in the trace (a killed driver:
its workers leave no record of their exit) has no detection and a null latency.

The timeline has one lane per process, top to bottom: drivers, workers by rank, chaos.
Spans are bars coloured by status, nested spans drawn thinner on top of their parent.  A
truncated span (its process never ended it) is hatched and faded, and drawn up to the
detected death of its process; a killed process with no detected death, up to its last
record; any other process (it outlived the trace), up to the run's last record.
Faults are red crosses on the chaos lane and on the victim's lane; detections are black
diamonds; an arrow on the chaos lane spans the latency between them.

pandas and matplotlib are imported only here, so ``import telemetry`` stays light.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import pandas as pd

if TYPE_CHECKING:
    from matplotlib.axes import Axes

STATUS_COLOURS = {"OK": "#4c72b0", "ERROR": "#c44e52", "UNSET": "#8c8c8c"}
FAULT_COLOUR = "#d62728"
DETECTION_COLOUR = "#222222"
_ROLE_ORDER = {"driver": 0, "worker": 1, "chaos": 2}
_BAR_HEIGHT = 0.62
_NESTED_SHRINK = 0.42
_SIGNAL_SLACK_NS = 2_000_000
_KILLS = ("kill_worker", "term_worker", "kill_driver")
_LATENCY_COLUMNS = [
    "fault_kind", "rank", "pid", "fault_ns", "detected_ns", "detected_by", "latency_ms",
]
_EVENT_COLUMNS = ["name", "time_ns", "span_id", "span_name", "attributes", "pid", "rank", "role"]


@dataclasses.dataclass(frozen=True)
class Detection:
    """One fault and the first sign, after it, that the driver noticed it (if any)."""

    kind: str
    rank: int | None
    pid: int | None
    fault_ns: int
    detected_ns: int | None
    detected_by: str
    detector_pid: int | None  # the process that recorded the detection

    @property
    def latency_ms(self) -> float | None:
        if self.detected_ns is None:
            return None
        return (self.detected_ns - self.fault_ns) / 1e6


@dataclasses.dataclass(frozen=True)
class Lane:
    """One horizontal lane: a process (or the virtual chaos lane when ``pid`` is None)."""

    label: str
    pid: int | None
    role: str


# ---------------------------------------------------------------------------- events


def events_from_spans(spans: pd.DataFrame) -> pd.DataFrame:
    """The events of ``telemetry.load_events`` rebuilt from a ``load_run`` frame.

    Point spans (process life, faults, deaths) become events at their start; span events
    (``exception``, ...) keep their own time and name their span.
    """
    rows: list[dict[str, Any]] = []
    for span in spans.itertuples(index=False):
        common = {"span_id": span.span_id, "span_name": span.name, "pid": span.pid,
                  "rank": span.rank, "role": span.role}
        if span.point:
            rows.append({"name": span.name, "time_ns": span.start_ns,
                         "attributes": dict(span.attributes or {}), **common})
        for event in span.events or ():
            rows.append({"name": event["name"], "time_ns": event["time_ns"],
                         "attributes": dict(event.get("attributes") or {}), **common})
    frame = pd.DataFrame(rows, columns=_EVENT_COLUMNS)
    return frame.sort_values("time_ns", kind="stable").reset_index(drop=True)


def _as_int(value: Any) -> int | None:
    if value is None or value is pd.NA:
        return None
    try:
        return None if pd.isna(value) else int(value)
    except (TypeError, ValueError):
        return None


def _faults(events: pd.DataFrame) -> list[dict[str, Any]]:
    """Each ``chaos.fault`` as kind, victim and the time chaos acted."""
    faults = []
    for event in events[events["name"] == "chaos.fault"].itertuples(index=False):
        attrs: Mapping[str, Any] = event.attributes or {}
        if "faultlab.fault.span_id" in attrs:
            continue  # the fault told into an affected RPC's trace: a copy of the fault span
        faults.append({
            "span_id": str(event.span_id),
            "kind": str(attrs.get("chaos.kind", "fault")),
            "rank": _as_int(attrs.get("faultlab.rank")),
            "pid": _as_int(attrs.get("process.pid")) or None,
            "time_ns": _as_int(attrs.get("chaos.time_ns")) or int(event.time_ns),
        })
    return sorted(faults, key=lambda f: f["time_ns"])


def _signs(events: pd.DataFrame) -> list[dict[str, Any]]:
    """Every sign of a noticed failure: deaths the monitor saw, errors RPCs raised."""
    signs = []
    for event in events.itertuples(index=False):
        attrs: Mapping[str, Any] = event.attributes or {}
        if event.name == "executor.worker_death":
            signs.append({
                "time_ns": _as_int(attrs.get("faultlab.detected_ns")) or int(event.time_ns),
                "by": "worker_death", "pid": _as_int(attrs.get("process.pid")),
                "rank": _as_int(attrs.get("faultlab.rank")), "detector": _as_int(event.pid),
            })
        elif event.name == "exception" and str(event.span_name).startswith("rpc "):
            signs.append({
                "time_ns": int(event.time_ns), "by": str(attrs.get("exception.type", "error")),
                "pid": None, "rank": None, "detector": _as_int(event.pid),
            })
    return sorted(signs, key=lambda s: s["time_ns"])


def _told_detections(events: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """fault span id -> its detection, as ``telemetry.story`` told it into the traces
    (``faultlab.detection`` span events)."""
    told: dict[str, dict[str, Any]] = {}
    for event in events[events["name"] == "faultlab.detection"].itertuples(index=False):
        attrs: Mapping[str, Any] = event.attributes or {}
        key = str(attrs.get("faultlab.fault.span_id", ""))
        if key and key not in told:
            raw = _as_int(attrs.get("faultlab.detection.raw_time_ns"))  # the event may sit
            told[key] = {"time_ns": raw or int(event.time_ns),  # at its RPC's edge
                         "by": str(attrs.get("faultlab.detection.by")),
                         "detector": _as_int(attrs.get("faultlab.detection.pid"))}
    return told


def _matches(fault: dict[str, Any], sign: dict[str, Any]) -> bool:
    if sign["time_ns"] < fault["time_ns"]:
        return False
    if sign["by"] != "worker_death":
        return True
    if fault["pid"] is not None and sign["pid"] is not None:
        return bool(fault["pid"] == sign["pid"])
    return bool(fault["rank"] == sign["rank"])


def fault_detections(events: pd.DataFrame) -> list[Detection]:
    """Pair every fault with the first matching sign of failure after it (see module doc)."""
    signs = _signs(events)
    told = _told_detections(events)
    detections = []
    for fault in _faults(events):
        sign = told.get(fault["span_id"]) or next((s for s in signs if _matches(fault, s)), None)
        detections.append(Detection(
            fault["kind"], fault["rank"], fault["pid"], fault["time_ns"],
            None if sign is None else sign["time_ns"],
            "" if sign is None else sign["by"], None if sign is None else sign["detector"],
        ))
    return detections


def _load(source: pd.DataFrame | str | os.PathLike[str]) -> tuple[pd.DataFrame | None, pd.DataFrame]:
    """(spans or None, events) from a run directory, a spans frame or an events frame."""
    if isinstance(source, pd.DataFrame):
        if "time_ns" in source.columns:
            return None, source
        return source, events_from_spans(source)
    from telemetry.frames import load_events, load_run

    return load_run(source), load_events(source)


def detection_latencies(source: pd.DataFrame | str | os.PathLike[str]) -> pd.DataFrame:
    """One row per fault: kind, victim rank and pid, fault and detection times, latency.

    ``source`` is a run directory, a ``load_run`` frame or a ``load_events`` frame.
    Columns: ``fault_kind, rank, pid, fault_ns, detected_ns, detected_by, latency_ms``
    (``detected_ns`` and ``latency_ms`` are null for a fault the trace never shows noticed).
    """
    _, events = _load(source)
    rows = [{"fault_kind": d.kind, "rank": d.rank, "pid": d.pid, "fault_ns": d.fault_ns,
             "detected_ns": d.detected_ns, "detected_by": d.detected_by or None,
             "latency_ms": d.latency_ms} for d in fault_detections(events)]
    frame = pd.DataFrame(rows, columns=_LATENCY_COLUMNS)
    for column in ("rank", "pid", "fault_ns", "detected_ns"):
        frame[column] = pd.array(frame[column].tolist(), dtype="Int64")
    frame["latency_ms"] = frame["latency_ms"].astype(float)
    return frame


# ---------------------------------------------------------------------------- lanes


def lanes_of(spans: pd.DataFrame, with_chaos: bool) -> list[Lane]:
    """Drivers, then workers by rank, then chaos processes (or a virtual chaos lane)."""
    procs = spans.groupby("pid", sort=False).agg(
        role=("role", "first"), rank=("rank", "first"), first=("start_ns", "min"))
    keyed = []
    for pid, row in procs.iterrows():
        rank = _as_int(row["rank"])
        order = (_ROLE_ORDER.get(str(row["role"]), 3), -1 if rank is None else rank, int(row["first"]))
        keyed.append((order, Lane(_lane_label(str(row["role"]), rank, int(pid)), int(pid), str(row["role"]))))
    lanes = [lane for _, lane in sorted(keyed, key=lambda k: k[0])]
    if with_chaos and not any(lane.role == "chaos" for lane in lanes):
        lanes.append(Lane("chaos", None, "chaos"))
    return lanes


def _lane_label(role: str, rank: int | None, pid: int) -> str:
    if role == "worker" and rank is not None:
        return f"worker {rank} (pid {pid})"
    return f"{role} (pid {pid})"


def _depths(spans: pd.DataFrame) -> dict[str, int]:
    """Nesting depth of each span among the spans of its own process."""
    parent = dict(zip(spans["span_id"], spans["parent_span_id"], strict=True))
    pid_of = dict(zip(spans["span_id"], spans["pid"], strict=True))
    depths: dict[str, int] = {}
    for span_id in parent:
        depth, current = 0, parent[span_id]
        while current in parent and pid_of[current] == pid_of[span_id] and depth < 32:
            depth, current = depth + 1, parent[current]
        depths[span_id] = depth
    return depths


def _draw_ends(spans: pd.DataFrame, detections: Iterable[Detection]) -> dict[int, int]:
    """Per process: where its open (truncated) spans stop.

    At its detected death; else, for the victim of a kill, at its own last record (or the
    kill); else at the run's last record: it was alive, or at least unheard of, till then.
    """
    last = spans[["start_ns", "end_ns", "last_seen_ns"]].max(axis=1, skipna=True)
    own = {int(pid): int(value) for pid, value in last.groupby(spans["pid"]).max().items()}
    run_end = max(own.values(), default=0)
    ends = dict.fromkeys(own, run_end)
    for d in detections:
        if d.pid not in own:
            continue
        if d.detected_ns is not None and d.detected_by == "worker_death":
            ends[d.pid] = max(own[d.pid], d.detected_ns)
        elif d.kind in _KILLS:
            ends[d.pid] = max(own[d.pid], d.fault_ns)
    return ends


# ---------------------------------------------------------------------------- drawing


@dataclasses.dataclass
class _Canvas:
    """The axes and the mapping from nanoseconds and pids to plot coordinates."""

    ax: Axes
    t0: int
    t1: int
    rows: dict[int, int]  # pid -> lane index (a virtual chaos lane has no pid)
    chaos_row: int | None

    def x(self, ns: int) -> float:
        return (ns - self.t0) / 1e6

    def visible(self, ns: int) -> bool:
        return self.t0 <= ns <= self.t1

    @property
    def width_ms(self) -> float:
        return max((self.t1 - self.t0) / 1e6, 1e-6)


def _draw_spans(canvas: _Canvas, spans: pd.DataFrame, ends: Mapping[int, int]) -> None:
    depths = _depths(spans)
    bars = spans[~spans["point"]].assign(depth=spans["span_id"].map(depths)).sort_values(
        "depth", kind="stable")
    min_width = canvas.width_ms * 0.004
    for span in bars.itertuples(index=False):
        start = int(span.start_ns)
        end = int(span.end_ns) if not span.truncated else max(start, ends.get(int(span.pid), start))
        if end < canvas.t0 or start > canvas.t1:
            continue
        left, right = canvas.x(max(start, canvas.t0)), canvas.x(min(end, canvas.t1))
        _bar(canvas, span, canvas.rows[int(span.pid)], left, max(right - left, min_width))


def _bar(canvas: _Canvas, span: Any, row: int, left: float, width: float) -> None:
    height = _BAR_HEIGHT * _NESTED_SHRINK ** int(span.depth)
    colour = STATUS_COLOURS.get(str(span.status), STATUS_COLOURS["UNSET"])
    if span.truncated:
        canvas.ax.barh(row, width, left=left, height=height, color=colour, alpha=0.35,
                       hatch="////", edgecolor=colour, linestyle="--", linewidth=0.8)
    else:
        canvas.ax.barh(row, width, left=left, height=height, color=colour,
                       edgecolor="white", linewidth=0.6)
    if span.depth == 0:
        _bar_label(canvas, str(span.name), row, left, width, "#333333" if span.truncated else "white")


def _bar_label(canvas: _Canvas, name: str, row: int, left: float, width: float, colour: str) -> None:
    text = name.removeprefix("worker.execute ").removeprefix("worker.")
    axes_px = canvas.ax.get_window_extent().width
    char_px = 7 * canvas.ax.figure.dpi / 72 * 0.62
    if width / canvas.width_ms * axes_px > (len(text) + 1) * char_px:
        canvas.ax.text(left + width / 2, row, text, ha="center", va="center", fontsize=7,
                       color=colour, clip_on=True)


def _draw_stops(canvas: _Canvas, spans: pd.DataFrame, detections: Iterable[Detection]) -> None:
    """A stopped (hung) worker records nothing: hatch its lane until its next record.

    Records within ``_SIGNAL_SLACK_NS`` of the fault were made before the SIGSTOP landed.
    """
    for d in detections:
        if d.kind != "hang_worker" or d.pid not in canvas.rows:
            continue
        until = min(_next_record(spans, d.pid, d.fault_ns + _SIGNAL_SLACK_NS) or canvas.t1,
                    canvas.t1)
        start = max(d.fault_ns, canvas.t0)
        if start < until:
            canvas.ax.barh(canvas.rows[d.pid], canvas.x(until) - canvas.x(start),
                           left=canvas.x(start), height=_BAR_HEIGHT * 1.15, facecolor="none",
                           edgecolor=FAULT_COLOUR, hatch="xx", linewidth=0.8, alpha=0.6, zorder=3)
            canvas.ax.text(canvas.x(start), canvas.rows[d.pid] - _BAR_HEIGHT * 0.6, " stopped",
                           fontsize=7, color=FAULT_COLOUR, va="bottom", ha="left", clip_on=True)


def _next_record(spans: pd.DataFrame, pid: int, after_ns: int) -> int | None:
    mine = spans[spans["pid"] == pid]
    stamps = pd.concat([mine["start_ns"], mine["end_ns"]]).dropna()
    later = stamps[stamps > after_ns]
    return int(later.min()) if len(later) else None


def _draw_points(canvas: _Canvas, events: pd.DataFrame) -> None:
    """Process-life points (start-up, shutdown steps, ...) as small ticks on their lane."""
    special = {"chaos.fault", "faultlab.detection", "executor.worker_death", "exception"}
    for event in events.itertuples(index=False):
        pid = _as_int(event.pid)
        if event.name in special or pid not in canvas.rows or not canvas.visible(int(event.time_ns)):
            continue
        canvas.ax.plot(canvas.x(int(event.time_ns)), canvas.rows[pid], marker="|", markersize=14,
                       color="#555555", linestyle="none")


def _draw_detections(canvas: _Canvas, detections: Iterable[Detection]) -> None:
    for d in detections:
        if canvas.visible(d.fault_ns):
            _fault_marker(canvas, d)
        if d.detected_ns is not None and canvas.visible(d.detected_ns):
            _detection_marker(canvas, d)
        if d.detected_ns is not None and canvas.chaos_row is not None:
            _latency_arrow(canvas, d, canvas.chaos_row)


def _fault_marker(canvas: _Canvas, d: Detection) -> None:
    x = canvas.x(d.fault_ns)
    canvas.ax.axvline(x, color=FAULT_COLOUR, linestyle=":", linewidth=1)
    rows = [canvas.rows[d.pid]] if d.pid in canvas.rows else []
    if canvas.chaos_row is not None:
        rows.append(canvas.chaos_row)
        where = "" if d.rank is None or d.kind == "kill_driver" else f" rank {d.rank}"
        unseen = " (no detection in the trace)" if d.detected_ns is None else ""
        canvas.ax.text(x, canvas.chaos_row + 0.2, f" {d.kind}{where}{unseen}", ha="left", va="top",
                       fontsize=8, color=FAULT_COLOUR)
    canvas.ax.plot([x] * len(rows), rows, marker="X", markersize=10, color=FAULT_COLOUR,
                   markeredgecolor="white", linestyle="none", zorder=5)


def _detection_marker(canvas: _Canvas, d: Detection) -> None:
    x = canvas.x(int(d.detected_ns or 0))
    canvas.ax.axvline(x, color=DETECTION_COLOUR, linestyle=":", linewidth=1)
    row = None if d.detector_pid is None else canvas.rows.get(d.detector_pid)
    if row is not None:
        canvas.ax.plot(x, row, marker="D", markersize=8, color=DETECTION_COLOUR,
                       markeredgecolor="white", linestyle="none", zorder=5)


def _latency_arrow(canvas: _Canvas, d: Detection, row: int) -> None:
    start, end = max(d.fault_ns, canvas.t0), min(int(d.detected_ns or 0), canvas.t1)
    if start > end:
        return
    y = row - 0.12
    canvas.ax.annotate("", xy=(canvas.x(end), y), xytext=(canvas.x(start), y),
                       arrowprops={"arrowstyle": "-|>", "color": DETECTION_COLOUR, "lw": 1.2})
    canvas.ax.text((canvas.x(start) + canvas.x(end)) / 2, y - 0.08,
                   f"detected after {d.latency_ms:.1f} ms ({d.detected_by})",
                   ha="center", va="bottom", fontsize=8, color=DETECTION_COLOUR)


def _legend(ax: Axes) -> None:
    from matplotlib.artist import Artist
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles: list[Artist] = [Patch(color=c, label=f"span {s}") for s, c in STATUS_COLOURS.items()]
    handles += [
        Patch(facecolor=STATUS_COLOURS["UNSET"], alpha=0.35, hatch="////",
              edgecolor=STATUS_COLOURS["UNSET"], label="open at death (truncated)"),
        Line2D([], [], marker="X", color=FAULT_COLOUR, linestyle="none", markersize=9,
               label="fault (chaos)"),
        Line2D([], [], marker="D", color=DETECTION_COLOUR, linestyle="none", markersize=7,
               label="detection"),
        Line2D([], [], marker="|", color="#555555", linestyle="none", markersize=10,
               label="process event"),
    ]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8,
              frameon=False)


def _time_window(spans: pd.DataFrame, events: pd.DataFrame, detections: Iterable[Detection],
                 start_ns: int | None, end_ns: int | None) -> tuple[int, int]:
    stamps = [int(v) for v in spans["start_ns"].dropna()]
    stamps += [int(v) for v in spans[["end_ns", "last_seen_ns"]].stack().dropna()]
    stamps += [int(v) for v in events["time_ns"].dropna()]
    for d in detections:
        stamps += [d.fault_ns] + ([d.detected_ns] if d.detected_ns is not None else [])
    if not stamps:
        raise ValueError("plot_timeline: the run has no spans and no events")
    return (min(stamps) if start_ns is None else start_ns,
            max(stamps) if end_ns is None else end_ns)


def plot_timeline(
    spans: pd.DataFrame | str | os.PathLike[str], events: pd.DataFrame | None = None,
    ax: Axes | None = None, title: str | None = None, *,
    start_ns: int | None = None, end_ns: int | None = None,
) -> Axes:
    """Draw the failure timeline of one run (see the module docstring); return the Axes.

    ``spans`` is a ``telemetry.load_run`` frame or a run directory; ``events`` a
    ``telemetry.load_events`` frame (read from the directory, or rebuilt from the spans,
    when None).  ``start_ns``/``end_ns`` crop the picture; the x axis counts milliseconds
    from ``start_ns`` (by default the run's first record).  A new figure is made when
    ``ax`` is None.
    """
    if not isinstance(spans, pd.DataFrame):
        from telemetry.frames import load_events, load_run

        events = load_events(spans) if events is None else events
        spans = load_run(spans)
    events = events_from_spans(spans) if events is None else events
    detections = fault_detections(events)
    lanes = lanes_of(spans, with_chaos=bool(detections))
    if ax is None:
        import matplotlib.pyplot as plt

        _, ax = plt.subplots(figsize=(11, 0.55 * len(lanes) + 1.3), layout="constrained")
    t0, t1 = _time_window(spans, events, detections, start_ns, end_ns)
    rows = {lane.pid: i for i, lane in enumerate(lanes) if lane.pid is not None}
    chaos_row = next((i for i, lane in enumerate(lanes) if lane.role == "chaos"), None)
    canvas = _Canvas(ax, t0, t1, rows, chaos_row)
    _draw_spans(canvas, spans, _draw_ends(spans, detections))
    _draw_stops(canvas, spans, detections)
    _draw_points(canvas, events)
    _draw_detections(canvas, detections)
    _style(canvas, lanes, title)
    return ax


def _style(canvas: _Canvas, lanes: list[Lane], title: str | None) -> None:
    ax = canvas.ax
    ax.set_yticks(range(len(lanes)), [lane.label for lane in lanes], fontsize=8)
    ax.set_ylim(len(lanes) - 0.5, -0.5)  # first lane on top
    pad = canvas.width_ms * 0.01
    ax.set_xlim(-pad, canvas.width_ms + pad)
    ax.set_xlabel("time (ms)")
    ax.grid(axis="x", color="#dddddd", linewidth=0.6)
    ax.set_axisbelow(True)
    for edge in ("top", "right"):
        ax.spines[edge].set_visible(False)
    if title:
        ax.set_title(title, fontsize=10, loc="left")
    _legend(ax)
