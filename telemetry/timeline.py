"""Draw a run's failure timeline: one lane per process, spans as bars, faults and deaths marked.

Data flow::

    load_run(run_dir) ──► lanes (driver, chaos, workers by rank) ──► matplotlib broken_barh
    load_events(run_dir) ──► markers (chaos.fault red, executor.worker_death black, others grey)

Times are milliseconds since the run's first span.  Within a lane, a span is drawn thinner
the deeper it nests, so children stay visible on top of their parents.  A span its process
never ended (truncated) is hatched and runs to that process's last record.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import pandas as pd

from telemetry.frames import load_events, load_run

if TYPE_CHECKING:
    from matplotlib.axes import Axes

_ROLE_ORDER = {"driver": 0, "chaos": 1, "worker": 2}
_MARKERS = {"chaos.fault": ("X", "tab:red"), "executor.worker_death": ("v", "black")}


def lanes(spans: pd.DataFrame) -> list[tuple[int, str]]:
    """``(pid, label)`` per process, driver first, then chaos, then workers by rank."""
    procs = spans.drop_duplicates("pid")[["pid", "role", "rank"]]
    ordered = sorted(
        procs.itertuples(index=False),
        key=lambda p: (_ROLE_ORDER.get(p.role, 3), -1 if pd.isna(p.rank) else p.rank, p.pid))
    return [(int(p.pid), _label(p.role, p.rank, p.pid)) for p in ordered]


def _label(role: str, rank: Any, pid: int) -> str:
    return f"{role} (pid {pid})" if pd.isna(rank) else f"{role} {rank} (pid {pid})"


def _depths(spans: pd.DataFrame) -> dict[str, int]:
    parent = dict(zip(spans.span_id, spans.parent_span_id, strict=True))
    depths: dict[str, int] = {}
    for span_id in spans.span_id:
        depth, cursor, seen = 0, parent.get(span_id), {span_id}
        while cursor is not None and cursor in parent and cursor not in seen:
            seen.add(cursor)
            depth, cursor = depth + 1, parent[cursor]
        depths[span_id] = depth
    return depths


def plot_timeline(
    run: pd.DataFrame | str | os.PathLike[str], events: pd.DataFrame | None = None,
    ax: Axes | None = None,
) -> Axes:
    """Draw ``run`` (a run directory or a ``load_run`` frame) and return the axes."""
    import matplotlib.pyplot as plt

    if not isinstance(run, pd.DataFrame):
        events = load_events(run) if events is None else events
        run = load_run(run)
    figure = None
    if ax is None:
        figure, ax = plt.subplots(figsize=(12, 1 + 0.6 * max(1, run.pid.nunique())))
    if run.empty:
        return ax
    t0 = int(run.start_ns.min())
    rows = {pid: i for i, (pid, _) in enumerate(lanes(run))}
    _draw_spans(ax, run[~run.point], rows, t0)
    if events is not None:
        _draw_events(ax, events, rows, t0)
    ax.set_yticks(range(len(rows)), [label for _, label in lanes(run)])
    ax.set_ylim(-0.6, len(rows) - 0.4)
    ax.invert_yaxis()
    ax.set_xlabel("ms since the first span")
    ax.grid(axis="x", alpha=0.3)
    if figure is not None:
        figure.tight_layout()
    return ax


def _draw_spans(ax: Axes, spans: pd.DataFrame, rows: dict[int, int], t0: int) -> None:
    depths = _depths(spans)
    for span in spans.itertuples(index=False):
        end = span.last_seen_ns if span.truncated else span.end_ns
        start_ms = (span.start_ns - t0) / 1e6
        width = max((int(end) - span.start_ns) / 1e6, 1e-3)
        height = max(0.8 - 0.15 * depths[span.span_id], 0.2)
        ax.broken_barh(
            [(start_ms, width)], (rows[span.pid] - height / 2, height),
            facecolors="tab:red" if span.status == "ERROR" else "tab:blue",
            edgecolor="black" if span.truncated else "none",
            hatch="//" if span.truncated else None, alpha=0.35 + 0.1 * depths[span.span_id],
        )


def _draw_events(ax: Axes, events: pd.DataFrame, rows: dict[int, int], t0: int) -> None:
    for event in events.itertuples(index=False):
        if event.pid not in rows:
            continue
        marker, color = _MARKERS.get(event.name, ("|", "grey"))
        ax.plot((event.time_ns - t0) / 1e6, rows[event.pid], marker=marker, color=color,
                markersize=9, linestyle="none")
