"""faultlab telemetry: crash-safe span journals, OpenTelemetry export, run loading.

Data flow::

    hot path (every process)             off the hot path
    get_recorder().start_span ─► journal-*.bin ─► LiveExporter (driver) ─► OTLP http/grpc
                                  (run dir)     ─► load_run / load_events ─► pandas
                                                ─► faultlab trace export / send

The public names below are the whole API; the executor calls only the recorder hooks::

    rec = get_recorder()                       # configured from OTEL_* / FAULTLAB_TRACE_DIR
    if rec.enabled:                            # off: this attribute read is the whole cost
        span = rec.start_span("rpc echo", parent=None, attributes={"rpc.method": "echo"})
        wire = SpanContext.to_wire(span.context)          # (trace_id, span_id, flags)
        ...                                               # worker: parent=SpanContext.from_wire(wire)
        span.add_event("chaos.fault", {"fault": "kill"})
        span.end(error=None)                   # or an exception / message: status ERROR
    rec.event("executor.worker_death", {"faultlab.rank": 1})   # a zero-length span

    configure_process("worker", rank, env=parent_tracing_env)  # first thing in a child
    shutdown()                                 # flush and close; also runs at exit

    parent = caller_parent()                   # the caller's OpenTelemetry span or TRACEPARENT
    with use_parent(span.context): ...         # what starts inside joins span's trace

With ``OTEL_TRACES_EXPORTER`` set, configuring the driver builds the exporter and its
resource and starts one daemon thread (``faultlab-trace-export``); at exit, after the
executors made since have shut down, that thread's final pass sends every span left, open
ones marked truncated, within ``OTEL_BSP_EXPORT_TIMEOUT``.

Children inherit the tracing configuration through the environment, except forkserver
children, which inherit the fork server's: pass them ``tracing_env()`` (taken in the parent)
as ``configure_process(..., env=...)``.  Heavy imports (pandas, the OpenTelemetry SDK,
matplotlib) happen inside the functions that need them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from telemetry.context import caller_parent, use_parent
from telemetry.recorder import (
    Recorder,
    configure_process,
    get_recorder,
    shutdown,
    tracing_env,
)
from telemetry.span import FLAG_SAMPLED, NonRecordingSpan, Span, SpanContext

if TYPE_CHECKING:
    from collections.abc import Iterator
    from os import PathLike

    import pandas as pd

    from telemetry.assemble import RecordedSpan


def load_run(run_dir: str | PathLike[str], columns: list[str] | None = None) -> pd.DataFrame:
    """One row per span of every journal in ``run_dir`` (see ``telemetry.frames``); only
    ``columns`` when given (a long run's frame without attributes and events stays small)."""
    from telemetry.frames import load_run as _load_run

    return _load_run(run_dir, columns)


def iter_traces(run_dir: str | PathLike[str]) -> Iterator[list[RecordedSpan]]:
    """The told spans of ``run_dir`` one trace at a time (``telemetry.stream``): memory
    bounded by the largest trace, not the run."""
    from telemetry.stream import iter_traces as _iter_traces

    return _iter_traces(run_dir)


def load_events(run_dir: str | PathLike[str]) -> pd.DataFrame:
    """One row per span event and per point event (faults, deaths, process life)."""
    from telemetry.frames import load_events as _load_events

    return _load_events(run_dir)


def __getattr__(name: str) -> Any:
    """Plotting lives in ``telemetry.plotting`` (matplotlib), imported on first use only."""
    if name in _PLOTTING:
        import importlib

        return getattr(importlib.import_module("telemetry.plotting"), name)
    raise AttributeError(f"module 'telemetry' has no attribute {name!r}")


_PLOTTING = ("plot_timeline", "detection_latencies", "fault_detections")

__all__ = [
    "FLAG_SAMPLED",
    "NonRecordingSpan",
    "Recorder",
    "Span",
    "SpanContext",
    "caller_parent",
    "configure_process",
    "get_recorder",
    "iter_traces",
    "load_events",
    "load_run",
    "shutdown",
    "tracing_env",
    "use_parent",
]
