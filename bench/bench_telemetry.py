"""Per-span cost of faultlab's span recorder against the plain OpenTelemetry SDK.

Each configuration runs in its own fresh interpreter (the recorder is configured from the
environment once per process), times ``REPEATS`` batches of ``SPANS`` start+end pairs, and
reports the median batch's cost per span in microseconds.

    python bench/bench_telemetry.py [--spans N] [--repeats R] [--rounds K] [--append FILE]

Configurations:
  off              tracing off: the executor's ``if rec.enabled:`` guard around a span
  journal 1%       recorder, root spans sampled by trace id at 1%
  journal 100%     recorder, every span journaled
  journal 100% +3a recorder, every span with three attributes (str, int, bool)
  journal+otlp     recorder at 100% with live OTLP/HTTP export to a local sink (export thread on)
  sdk 1%           plain SDK TracerProvider, TraceIdRatioBased(0.01), BatchSpanProcessor
  sdk 100%         plain SDK, BatchSpanProcessor + OTLP/HTTP exporter to a local sink
  sdk 100% +3a     the same with three attributes per span
  sdk 100% no-op exporter  BatchSpanProcessor whose exporter drops batches: SDK span cost alone
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

ATTRS: dict[str, Any] = {"rpc.method": "echo", "faultlab.rpc_id": 7, "faultlab.non_block": False}
CONFIGS: dict[str, dict[str, str]] = {
    "off": {},
    "journal 1%": {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.01"},
    "journal 100%": {},
    "journal 100% +3a": {},
    "journal+otlp 100%": {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_BSP_SCHEDULE_DELAY": "200"},
    "sdk 1%": {},
    "sdk 100%": {},
    "sdk 100% +3a": {},
    "sdk 100% no-op exporter": {},
}


class _Sink(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


def _start_sink() -> tuple[ThreadingHTTPServer, str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def _time_batches(one: Callable[[], None], spans: int, repeats: int) -> list[float]:
    for _ in range(min(spans, 2000)):  # warm up: interning, page faults, caches
        one()
    out = []
    for _ in range(repeats):
        start = time.perf_counter_ns()
        for _ in range(spans):
            one()
        out.append((time.perf_counter_ns() - start) / spans / 1000.0)
    return out


def _recorder_case(name: str) -> Callable[[], None]:
    import telemetry

    telemetry.configure_process("driver")
    rec = telemetry.get_recorder()
    attrs = ATTRS if name.endswith("+3a") else None

    def one() -> None:
        if rec.enabled:
            rec.start_span("rpc echo", None, attrs).end()

    return one


def _drop_exporter_class() -> type:
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    class DropExporter(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    return DropExporter


def _sdk_case(name: str, endpoint: str) -> Callable[[], None]:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
    from opentelemetry.sdk.trace.sampling import TraceIdRatioBased

    sampler = TraceIdRatioBased(0.01) if "1%" in name else None
    provider = TracerProvider(sampler=sampler)
    exporter: SpanExporter = OTLPSpanExporter(endpoint=endpoint + "/v1/traces")
    if name.endswith("no-op exporter"):
        exporter = _drop_exporter_class()()
    provider.add_span_processor(BatchSpanProcessor(exporter))
    tracer = provider.get_tracer("bench")
    attrs = ATTRS if name.endswith("+3a") else None

    def one() -> None:
        with tracer.start_as_current_span("rpc echo", attributes=attrs):
            pass

    return one


def run_child(name: str, spans: int, repeats: int) -> dict[str, Any]:
    """One configuration, in this fresh interpreter; the OTLP sink runs in the parent."""
    endpoint = os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"]
    one = _sdk_case(name, endpoint) if name.startswith("sdk") else _recorder_case(name)
    per_span = _time_batches(one, spans, repeats)
    if not name.startswith("sdk"):
        import telemetry

        telemetry.shutdown()
    return {"name": name, "per_span": per_span}


def run_all(spans: int, repeats: int, rounds: int) -> list[dict[str, Any]]:
    """``rounds`` passes over every configuration, interleaved so load drift hits all alike."""
    batches: dict[str, list[float]] = {name: [] for name in CONFIGS}
    server, endpoint = _start_sink()  # in this process, so it does not slow the measured one
    try:
        for _ in range(rounds):
            for name, extra in CONFIGS.items():
                config_env = {**extra, "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint}
                batches[name].extend(_run_config(name, config_env, spans, repeats))
    finally:
        server.shutdown()
    results = []
    for name, per_span in batches.items():
        results.append({"name": name, "median_us": statistics.median(per_span),
                        "min_us": min(per_span)})
        print(f"{name:20s} median {results[-1]['median_us']:7.2f} µs/span", file=sys.stderr)
    return results


def _run_config(name: str, extra: dict[str, str], spans: int, repeats: int) -> list[float]:
    with tempfile.TemporaryDirectory(prefix="faultlab-bench-") as run_dir:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("OTEL_", "FAULTLAB_TRACE"))}
        env.update(extra)
        if name.startswith("journal"):
            env["FAULTLAB_TRACE_DIR"] = run_dir
        cmd = [sys.executable, __file__, "--child", name, "--spans", str(spans),
               "--repeats", str(repeats)]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
        per_span: list[float] = json.loads(out.stdout.strip().splitlines()[-1])["per_span"]
        return per_span


def markdown(results: list[dict[str, Any]], spans: int, repeats: int, rounds: int) -> str:
    base = next(r["median_us"] for r in results if r["name"] == "sdk 100%")
    lines = [
        "## Telemetry",
        "",
        f"`bench/bench_telemetry.py`: cost of one span (start + end), median of "
        f"{rounds} rounds x {repeats} batches of {spans} spans, each round of each "
        "configuration in a fresh interpreter, rounds interleaved; "
        f"{platform.python_implementation()} {platform.python_version()}, "
        f"{os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d')}.",
        "",
        "| configuration | µs/span (median) | µs/span (min) | vs plain SDK 100% |",
        "| --- | ---: | ---: | ---: |",
    ]
    for r in results:
        lines.append(f"| {r['name']} | {r['median_us']:.2f} | {r['min_us']:.2f} "
                     f"| {r['median_us'] / base:.2f}× |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--append", default=None, help="append a markdown section to FILE")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_child(args.child, args.spans, args.repeats)))
        return 0
    results = run_all(args.spans, args.repeats, args.rounds)
    text = markdown(results, args.spans, args.repeats, args.rounds)
    print(text)
    if args.append:
        with open(args.append, "a", encoding="utf-8") as f:
            f.write("\n" + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
