"""``faultlab trace``: export a recorded run to files, or replay it to an OTLP endpoint.

The app's command; the formats and their converters are the library's
(``telemetry.exports``).

Data flow::

    faultlab trace export RUN_DIR --format jaeger|otlp-json|perfetto [--out FILE]
        read_run ──► jaeger_json / otlp_json / perfetto_json ──► FILE or stdout
    faultlab trace send RUN_DIR [--endpoint URL] [--protocol grpc|http/protobuf]
        read_run ──► otel.to_readable_spans ──► SDK OTLP exporter ──► collector / Jaeger

Both check RUN_DIR first: a missing directory, or one holding no faultlab journal (nothing,
or only foreign files), is a usage error (one stderr line, exit 2, no output file written),
not an empty trace.  So is an ``--out`` that cannot be written (checked when parsed; a write
that still fails, as to ``/dev/full``, is one line too, exit 2).  Imports of pandas and the
SDK stay inside ``run``: the dispatcher imports this module to build its parser.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from faultlab.usage import UsageError, output_file, write_output, write_stdout
from telemetry.exports import DEFAULT_FORMAT, EXPORT_FORMATS, render

FORMATS = tuple(EXPORT_FORMATS)


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


def _export(run_dir: Path, fmt: str, out: Path | None) -> int:
    text = json.dumps(render(run_dir, fmt), separators=(",", ":"))
    if out is None:
        write_stdout(text + "\n")
    else:
        write_output(out, text + "\n")
        print(f"wrote {fmt} trace of {run_dir} to {out}", file=sys.stderr)
    return 0


def _send(run_dir: Path, endpoint: str | None, protocol: str | None) -> int:
    from telemetry.assemble import read_run
    from telemetry.config import Settings
    from telemetry.otel import export_spans, make_exporter, to_readable_spans

    spans = read_run(run_dir)
    protocol = protocol or Settings.from_env().protocol
    exporter = make_exporter("otlp", protocol, endpoint)
    try:
        ok = export_spans(exporter, to_readable_spans(spans)) == len(spans)
    finally:
        exporter.shutdown()
    where = endpoint or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") \
        or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or "the default OTLP endpoint"
    processes = len({s.process for s in spans})
    if not ok:
        print(f"faultlab trace send: export to {where} failed", file=sys.stderr)
        return 1
    print(f"sent {len(spans)} spans from {processes} processes to {where} ({protocol})",
          file=sys.stderr)
    return 0
