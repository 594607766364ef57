"""Export formats of a recorded run: one registry, so an unknown format is an error.

    EXPORT_FORMATS: name ──► (module, converter, writer)
        jaeger     telemetry.jaeger_json    to_jaeger / write_jaeger        (Jaeger UI: Upload JSON)
        otlp-json  telemetry.otlp_json      to_otlp_json / write_otlp_json  (as a collector reads it)
        perfetto   telemetry.perfetto_json  to_perfetto / write_perfetto    (Perfetto UI, chrome://tracing)

A converter turns a list of spans into one JSON document (``render``: the whole run read at
once, for small runs and tests).  A writer writes the same document to a text file from a
stream of told traces (``write_export``: ``telemetry.stream``, one trace held at a time),
which is what ``faultlab trace export`` uses, whatever the run's length.  A name not in
the registry raises ``ValueError`` naming the known ones (it used to fall through to
OTLP).  Converters are imported on use: pandas and the SDK stay out of the command line's
start.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any, TextIO

EXPORT_FORMATS: dict[str, tuple[str, str, str]] = {
    "jaeger": ("telemetry.jaeger_json", "to_jaeger", "write_jaeger"),
    "otlp-json": ("telemetry.otlp_json", "to_otlp_json", "write_otlp_json"),
    "perfetto": ("telemetry.perfetto_json", "to_perfetto", "write_perfetto"),
}
DEFAULT_FORMAT = "jaeger"
PARALLEL_MIN_TRACES = 20_000  # fewer: forking costs more than a second process saves
_DOCUMENT_HEADS = {"jaeger": '{"data":[', "otlp-json": '{"resourceSpans":['}  # then "]}"


def _entry(fmt: str, which: int) -> Any:
    try:
        entry = EXPORT_FORMATS[fmt]
    except KeyError:
        raise ValueError(f"unknown export format {fmt!r}; known: {', '.join(EXPORT_FORMATS)}") from None
    return getattr(importlib.import_module(entry[0]), entry[which])


def converter(fmt: str) -> Any:
    """The function that turns a run's spans into format ``fmt``."""
    return _entry(fmt, 1)


def writer(fmt: str) -> Any:
    """The function that writes format ``fmt`` from a stream of traces."""
    return _entry(fmt, 2)


def render(run_dir: str | Path, fmt: str = DEFAULT_FORMAT) -> dict[str, Any]:
    """The JSON document of ``run_dir`` in format ``fmt`` (the whole run in memory)."""
    from telemetry.assemble import read_run

    convert = converter(fmt)  # an unknown format fails before the run is read
    doc: dict[str, Any] = convert(read_run(Path(run_dir)))
    return doc


def write_export(
    run_dir: str | Path, fmt: str, out: TextIO, workers: int | None = None,
) -> int:
    """Write ``run_dir`` in format ``fmt`` to ``out``, one trace at a time; the span count.

    ``workers`` > 1 splits the traces of Jaeger and OTLP JSON between that many forked
    processes (default: one per CPU once the run has ``PARALLEL_MIN_TRACES`` traces); the
    text is the same.  Perfetto's tracks need one time-ordered pass: always one process."""
    from telemetry.stream import RunStream

    write = writer(fmt)  # an unknown format fails before the run is read
    stream = RunStream(run_dir)
    if fmt == "perfetto":
        return int(write(stream.traces(), out, stream.t0_ns))
    if workers is None:
        enough = stream.n_traces >= PARALLEL_MIN_TRACES
        workers = len(os.sched_getaffinity(0)) if enough else 1
    if workers <= 1:
        return int(write(stream.traces(), out))
    from telemetry.export_parts import write_in_parts

    return write_in_parts(stream, write, _DOCUMENT_HEADS[fmt], out, workers)
