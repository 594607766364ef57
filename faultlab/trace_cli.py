"""``faultlab trace``: export a recorded run to files, or replay it to an OTLP endpoint.

The app's command; the formats and their converters are the library's
(``telemetry.exports``).

Data flow::

    faultlab trace export RUN_DIR --format jaeger|otlp-json|perfetto [--out FILE]
        stream.RunStream (one trace at a time) ──► write_jaeger / write_otlp_json /
        write_perfetto ──► FILE or stdout, 1 MiB at a time
    faultlab trace send RUN_DIR [--endpoint URL] [--protocol grpc|http/protobuf]
        stream.RunStream ──► otel.to_readable_spans ──► batches ──► SDK OTLP exporter

Both check RUN_DIR first: a missing directory, or one holding no faultlab journal (nothing,
or only foreign files), is a usage error (one stderr line, exit 2, no output file written),
not an empty trace.  So is an ``--out`` that cannot be written (checked when parsed; a write
that still fails, as to ``/dev/full``, is one line too, exit 2).  Imports of pandas and the
SDK stay inside ``run``: the dispatcher imports this module to build its parser.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TextIO, TypeVar

from faultlab.usage import UsageError, output_file, write_stdout
from telemetry.exports import DEFAULT_FORMAT, EXPORT_FORMATS, write_export

FORMATS = tuple(EXPORT_FORMATS)
T = TypeVar("T")


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="trace_command", required=True)
    export = sub.add_parser("export", help="write a run's spans as Jaeger, OTLP or Perfetto JSON")
    export.add_argument("run_dir", type=Path, metavar="RUN_DIR",
                        help="the trace directory of a traced run (FAULTLAB_TRACE_DIR, or "
                             "DIR/SCENARIO/trace of a chaos run)")
    export.add_argument("--format", choices=FORMATS, default=DEFAULT_FORMAT,
                        help=f"jaeger (Jaeger UI: Search, Upload JSON), otlp-json, or perfetto "
                             f"(ui.perfetto.dev); default: {DEFAULT_FORMAT}")
    export.add_argument("--out", type=output_file, default=None,
                        help="output file (default: stdout)")
    send = sub.add_parser("send", help="replay a run's spans to an OTLP endpoint")
    send.add_argument("run_dir", type=Path, metavar="RUN_DIR",
                      help="the trace directory of a traced run")
    send.add_argument("--endpoint", default=None,
                      help="OTLP endpoint (default: from OTEL_EXPORTER_OTLP_*_ENDPOINT)")
    send.add_argument("--protocol", choices=("grpc", "http/protobuf"), default=None,
                      help="default: OTEL_EXPORTER_OTLP_PROTOCOL, else http/protobuf")


def run(args: argparse.Namespace) -> int:
    check_run_dir(args.run_dir)
    if args.trace_command == "export":
        return _export(args.run_dir, args.format, args.out)
    return _send(args.run_dir, args.endpoint, args.protocol)


def check_run_dir(run_dir: Path) -> None:
    """Raise ``UsageError`` unless ``run_dir`` holds at least one faultlab journal."""
    from telemetry.journal import find_journals

    expected = "the trace directory of a traced run, holding journal-*.bin files"
    if not run_dir.is_dir():
        raise UsageError(f"{run_dir} is not a directory; expected {expected}")
    if not find_journals(run_dir):
        hint = f" (did you mean {run_dir / 'trace'}?)" if (run_dir / "trace").is_dir() else ""
        raise UsageError(f"{run_dir} holds no faultlab journal; expected {expected}{hint}")


class _Sink:
    """A text sink for a streamed export: ``--out FILE`` or stdout, written 1 MiB at a time;
    a failed write (``/dev/full``, a closed pipe) is one ``UsageError`` line."""

    LIMIT = 1 << 20

    def __init__(self, out: Path | None) -> None:
        self.out = out
        self._parts: list[str] = []
        self._size = 0
        self._file: TextIO | None = None
        if out is not None:
            self._guard(lambda: out.parent.mkdir(parents=True, exist_ok=True))
            self._file = self._guard(lambda: open(out, "w", encoding="utf-8"))  # noqa: SIM115

    def write(self, text: str) -> None:
        self._parts.append(text)
        self._size += len(text)
        if self._size >= self.LIMIT:
            self.flush()

    def flush(self) -> None:
        text, self._parts, self._size = "".join(self._parts), [], 0
        if self._file is None:
            write_stdout(text)
        else:
            file = self._file
            self._guard(lambda: file.write(text))

    def close(self) -> None:
        self.flush()
        if self._file is not None:
            file, self._file = self._file, None
            self._guard(file.close)

    def _guard(self, action: Callable[[], T]) -> T:
        try:
            return action()
        except OSError as exc:
            if self._file is not None:
                with contextlib.suppress(OSError):
                    self._file.close()
                self._file = None
            reason = str(getattr(exc, "strerror", None) or exc)
            raise UsageError(f"cannot write {self.out}: {reason}") from None


def _export(run_dir: Path, fmt: str, out: Path | None) -> int:
    """Stream the run, one trace at a time (``telemetry.exports.write_export``)."""
    sink = _Sink(out)
    try:
        write_export(run_dir, fmt, sink)  # type: ignore[arg-type]  # has write()
        sink.write("\n")
    finally:
        sink.close()
    if out is not None:
        print(f"wrote {fmt} trace of {run_dir} to {out}", file=sys.stderr)
    return 0


def _send(run_dir: Path, endpoint: str | None, protocol: str | None) -> int:
    """Replay the run in batches of told traces (``telemetry.stream``): memory stays
    bounded by a batch and the largest trace; a long run is sent by one process per CPU
    (``telemetry.export_parts``), each stopping at its first refused batch."""
    from telemetry.config import Settings
    from telemetry.exports import PARALLEL_MIN_TRACES
    from telemetry.stream import RunStream

    stream = RunStream(run_dir)
    protocol = protocol or Settings.from_env().protocol
    task = functools.partial(_send_part, protocol=protocol, endpoint=endpoint)
    workers = len(os.sched_getaffinity(0)) if stream.n_traces >= PARALLEL_MIN_TRACES else 1
    if workers > 1:
        from telemetry.export_parts import run_in_parts

        results = run_in_parts(stream, task, workers)
    else:
        results = [task(stream, 0, 0, stream.n_traces)]
    sent, ok = sum(r if r >= 0 else -r - 1 for r in results), all(r >= 0 for r in results)
    where = endpoint or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") \
        or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or "the default OTLP endpoint"
    if not ok:
        print(f"faultlab trace send: export to {where} failed", file=sys.stderr)
        return 1
    print(f"sent {sent} spans from {len(stream.processes)} processes to {where} ({protocol})",
          file=sys.stderr)
    return 0


def _send_part(stream: Any, part: int, start: int, stop: int, *, protocol: str,
               endpoint: str | None) -> int:
    """Send traces [start, stop) through an exporter of this process: the spans sent, or
    -(sent + 1) when a batch was refused."""
    from telemetry.otel import base_resource, make_exporter, to_readable_spans

    exporter = make_exporter("otlp", protocol, endpoint)
    base, resources = base_resource(), {}  # type: ignore[var-annotated]
    try:
        sent, ok = _send_batches(exporter, (to_readable_spans(spans, base, resources)
                                            for spans in stream.traces(start, stop)))
    finally:
        exporter.shutdown()
    return sent if ok else -sent - 1


def _send_batches(exporter: Any, traces: Iterable[list[Any]]) -> tuple[int, bool]:
    """Export ``BATCH_SIZE`` SDK spans at a time; (spans sent, all accepted).  Stopping at
    the first refused batch matters: each one can spend the exporter's whole retry budget."""
    from opentelemetry.sdk.trace.export import SpanExportResult

    from telemetry.otel import BATCH_SIZE

    sent, batch = 0, []
    for spans in traces:
        batch.extend(spans)
        while len(batch) >= BATCH_SIZE:
            if exporter.export(batch[:BATCH_SIZE]) != SpanExportResult.SUCCESS:
                return sent, False
            sent, batch = sent + BATCH_SIZE, batch[BATCH_SIZE:]
    if batch and exporter.export(batch) != SpanExportResult.SUCCESS:
        return sent, False
    return sent + len(batch), True
