"""Exports of a long traced run: wall time and peak RSS, whole-run (before) vs streamed (after).

    python bench/bench_export_long.py                    # makes the run (118,780 RPCs), then measures
    python bench/bench_export_long.py --run DIR          # reuses a traced run directory
    python bench/bench_export_long.py --only new --write # streamed only; update bench/RESULTS.md

    parent ── bench_long_traced.py --child (117,779 traced echo RPCs after 1,000 warm-up:
              the 20 s traced run of issue 22, ~44 MB of journal, ~1.2 M spans) ──► run dir
    parent ── one child process per (task, implementation), one after another:
              child: the task, then wall time and resource.getrusage ru_maxrss (the child's
              own or its largest child's: a split export's part processes) ──► JSON line
       load       before: frames.spans_frame(read_run(dir))   after: telemetry.load_run(dir)
                  (and after, columns only: load_run(dir, columns=[name, ids, times, status]))
       jaeger     before: json.dumps(render(dir, "jaeger"))  after: faultlab trace export
       perfetto   the same, --format perfetto
       send       before: read_run ─► to_readable_spans ─► export_spans, in 512-span batches
                  after: faultlab trace send; both to an OTLP/HTTP receiver on loopback that
                  this script runs in its own process (it parses each request, counts spans)
    parent ◄── the table, the ratios after/before; deletes a run it made

Timings are single runs on a shared 2-core machine: compare the two columns of one run.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for _p in (str(HERE), str(ROOT)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from _stats import machine, markdown_table, write_section  # noqa: E402

RPCS = 117_779  # + 1,000 warm-up + 1 check: 118,780 RPCs, the 20 s traced run
TASKS = ("load", "load-columns", "jaeger", "perfetto", "send")
COLUMNS = ["name", "trace_id", "span_id", "parent_span_id", "pid", "rank", "start_ns",
           "end_ns", "status"]
TITLE = "Long traced run: streamed exports (issue 22)"


# ---------------------------------------------------------------- the receiver

def _receive(port_out: Any, stop: Any) -> None:
    """An OTLP/HTTP receiver on loopback: parses each request and counts its spans."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
        ExportTraceServiceResponse,
    )

    counts = {"spans": 0, "requests": 0}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            request = ExportTraceServiceRequest.FromString(body)
            counts["spans"] += sum(len(ss.spans) for rs in request.resource_spans
                                   for ss in rs.scope_spans)
            counts["requests"] += 1
            reply = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def do_GET(self) -> None:
            body = json.dumps(counts).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    port_out.send(server.server_address[1])
    import threading

    threading.Thread(target=server.serve_forever, daemon=True).start()
    stop.wait()
    server.shutdown()


def _received(port: int) -> dict[str, int]:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30) as reply:
        return dict(json.loads(reply.read()))


# ---------------------------------------------------------------- one measurement (child)

def measure(task: str, impl: str, run_dir: Path, out: Path, port: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    spans = _run_task(task, impl, run_dir, out, port)
    wall = time.perf_counter() - t0
    # The larger of this process and its largest child (a split export's part processes).
    peak = max(resource.getrusage(who).ru_maxrss
               for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)) * 1024
    return {"task": task, "impl": impl, "wall_s": wall, "peak_rss": peak, "spans": spans,
            "out_bytes": out.stat().st_size if out.exists() else 0}


def _run_task(task: str, impl: str, run_dir: Path, out: Path, port: int) -> int:
    if task in ("load", "load-columns"):
        return _load(task, impl, run_dir)
    if task == "send":
        return _send(impl, run_dir, port)
    if impl == "before":
        from telemetry.exports import render

        out.write_text(json.dumps(render(run_dir, task), separators=(",", ":")) + "\n")
        return -1
    from faultlab.cli import main

    if main(["trace", "export", str(run_dir), "--format", task, "--out", str(out)]) != 0:
        raise SystemExit(f"faultlab trace export --format {task} failed")
    return -1


def _load(task: str, impl: str, run_dir: Path) -> int:
    import telemetry

    if impl == "before":
        from telemetry.assemble import read_run
        from telemetry.frames import spans_frame

        frame = spans_frame(read_run(run_dir))
        return len(frame if task == "load" else frame[COLUMNS])
    return len(telemetry.load_run(run_dir, None if task == "load" else COLUMNS))


def _send(impl: str, run_dir: Path, port: int) -> int:
    endpoint = f"http://127.0.0.1:{port}"
    before = _received(port)["spans"]
    if impl == "before":
        from telemetry.assemble import read_run
        from telemetry.otel import export_spans, make_exporter, to_readable_spans

        exporter = make_exporter("otlp", "http/protobuf", endpoint)
        try:
            export_spans(exporter, to_readable_spans(read_run(run_dir)))
        finally:
            exporter.shutdown()
    else:
        from faultlab.cli import main

        if main(["trace", "send", str(run_dir), "--endpoint", endpoint,
                 "--protocol", "http/protobuf"]) != 0:
            raise SystemExit("faultlab trace send failed")
    return _received(port)["spans"] - before


# ---------------------------------------------------------------- the parent

def _make_run(run_dir: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "FAULTLAB_TRACE"))}
    env["FAULTLAB_TRACE_DIR"] = str(run_dir)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(ROOT), env.get("PYTHONPATH", "")])
    t0 = time.perf_counter()
    subprocess.run([sys.executable, str(HERE / "bench_long_traced.py"), "--child", "--rpcs",
                    str(RPCS), "--every", str(RPCS)], env=env, check=True, cwd=ROOT,
                   stdout=subprocess.DEVNULL)
    print(f"made the traced run in {time.perf_counter() - t0:.1f} s: {run_dir}", file=sys.stderr)


def _child(task: str, impl: str, run_dir: Path, out: Path, port: int) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "FAULTLAB_TRACE"))}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    result = subprocess.run(
        [sys.executable, __file__, "--measure", task, "--impl", impl, "--run", str(run_dir),
         "--out", str(out), "--port", str(port)],
        env=env, check=True, cwd=ROOT, capture_output=True, text=True)
    return dict(json.loads(result.stdout.strip().splitlines()[-1]))


def _journal_bytes(run_dir: Path) -> int:
    return sum(p.stat().st_size for p in run_dir.glob("journal-*.bin"))


def _table(results: list[dict[str, Any]]) -> str:
    by = {(r["task"], r["impl"]): r for r in results}
    rows = []
    for task in TASKS:
        before, after = by.get((task, "before")), by.get((task, "after"))

        def cell(r: dict[str, Any] | None) -> str:
            if r is None:
                return "–"
            return f"{r['wall_s']:.1f} s / {r['peak_rss'] / (1 << 20):,.0f} MiB"

        ratio = "–"
        if before and after:
            ratio = (f"{after['wall_s'] / before['wall_s']:.2f}× / "
                     f"{after['peak_rss'] / before['peak_rss']:.2f}×")
        rows.append([task, cell(before), cell(after), ratio])
    return markdown_table(["task", "before: whole run (wall / peak RSS)",
                           "after: streamed (wall / peak RSS)", "after / before"], rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, default=None, help="reuse this traced run directory")
    parser.add_argument("--only", choices=("before", "after", "new", "old"), default=None,
                        help="measure one implementation only (new = after, old = before)")
    parser.add_argument("--tasks", default=",".join(TASKS), help=f"comma list of {TASKS}")
    parser.add_argument("--write", action="store_true", help="update bench/RESULTS.md")
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    parser.add_argument("--impl", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure, args.impl, args.run, args.out, args.port)))
        return
    tasks = [t for t in args.tasks.split(",") if t]
    unknown = set(tasks) - set(TASKS)
    if unknown:
        parser.error(f"unknown tasks {sorted(unknown)}; known: {', '.join(TASKS)}")
    impls = {"new": ["after"], "after": ["after"], "old": ["before"],
             "before": ["before"]}.get(args.only or "", ["before", "after"])
    scratch = Path(tempfile.mkdtemp(prefix="faultlab-export-long-"))
    run_dir = args.run or scratch / "run"
    ctx = multiprocessing.get_context("spawn")
    port_in, port_out = ctx.Pipe(duplex=False)
    stop = ctx.Event()
    receiver = ctx.Process(target=_receive, args=(port_out, stop), daemon=True)
    results: list[dict[str, Any]] = []
    try:
        if args.run is None:
            _make_run(run_dir)
        receiver.start()
        port = port_in.recv()
        for task in tasks:
            for impl in impls:
                out = scratch / f"{task}-{impl}.json"
                results.append(_child(task, impl, run_dir, out, port))
                r = results[-1]
                print(f"  {task:13} {impl:6} {r['wall_s']:6.1f} s  "
                      f"{r['peak_rss'] / (1 << 20):7,.0f} MiB  spans {r['spans']}  "
                      f"out {r['out_bytes'] / (1 << 20):,.0f} MiB", file=sys.stderr, flush=True)
                out.unlink(missing_ok=True)
        journal = _journal_bytes(run_dir)
    finally:
        stop.set()
        receiver.join(10)
        if receiver.is_alive():
            receiver.kill()
        shutil.rmtree(scratch, ignore_errors=True)
    text = _report(results, journal)
    print(text)
    if args.write:
        write_section(HERE / "RESULTS.md", TITLE, text)


def _report(results: list[dict[str, Any]], journal: int) -> str:
    return (
        f"`.venv/bin/python bench/bench_export_long.py` on the run `bench_long_traced.py` makes "
        f"with `--rpcs {RPCS}` (118,780 traced echo RPCs, TP=2; {journal / (1 << 20):.0f} MiB "
        f"of journal). Each cell is one child process: wall time of the task and its peak RSS "
        f"(`ru_maxrss`, interpreter and imports included). *before* reads the whole run "
        f"(`read_run`) and builds the whole document; *after* streams it trace by trace "
        f"(`telemetry.stream`). *send* goes to an OTLP/HTTP receiver on loopback run by the "
        f"bench. Single runs on a shared machine: compare within a row. Machine: {machine()}.\n\n"
        + _table(results) + "\n"
    )


if __name__ == "__main__":
    main()
