"""What tracing costs a small broadcast RPC: off, 1 % sampled, 100 %, and the plain SDK.

    parent ──► child driver process per configuration (tracing is configured per process
               from the environment) ── N small echo RPCs to 2 fork workers ──► latencies
           ◄── JSON on stdout; children run round-robin, several rounds, so load drifts
               hit every configuration alike; medians of per-round medians, ratios vs off

Configurations:
- ``off``: no FAULTLAB_TRACE_DIR, no OTEL_TRACES_EXPORTER (one attribute read per call site);
- ``sampled-1%`` / ``on-100%``: faultlab's journal recorder (FAULTLAB_TRACE_DIR set,
  OTEL_TRACES_SAMPLER=parentbased_traceidratio with 0.01 / 1.0);
- ``plain-sdk``: tracing off in faultlab, and instead the OpenTelemetry SDK wired the
  obvious way: a BatchSpanProcessor in driver and workers, a span around each call in the
  driver, W3C context injected into the call's kwargs, a child span around the method in
  each worker.  Its exporter drops everything, so only the SDK's own cost is measured.

With ``--before-tree DIR`` (a checkout of an earlier version, e.g. ``git worktree add``),
that tree's executor runs each configuration too, interleaved in the same rounds: a
before/after measured under the same load, with the ratios against each tree's own ``off``.

Run: ``python bench/bench_rpc_tracing.py [--quick] [--before-tree DIR] [--out bench/RESULTS.md]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _stats

from executor import ExecutorConfig, MultiprocExecutor
from executor.workers import EchoWorker

CONFIGS = ("off", "sampled-1%", "on-100%", "plain-sdk")
ROOT = Path(__file__).resolve().parent.parent  # this tree (children of --before-tree run there)


def _sdk_tracer(name: str) -> Any:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class Drop(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Drop()))
    return provider.get_tracer(name)


class SdkEchoWorker(EchoWorker):
    """EchoWorker whose ``traced_echo`` opens an SDK span, child of the driver's."""

    def __init__(self, ctx: Any) -> None:
        super().__init__(ctx)
        self._tracer = _sdk_tracer("bench-worker")

    def traced_echo(self, x: Any, carrier: dict[str, str]) -> Any:
        from opentelemetry.propagate import extract

        with self._tracer.start_as_current_span("execute echo", context=extract(carrier)):
            return x


def _child(config: str, calls: int) -> None:
    worker = "bench_rpc_tracing:SdkEchoWorker" if config == "plain-sdk" else "executor.workers:EchoWorker"
    cfg = ExecutorConfig(worker=worker, tensor_parallel_size=2, start_method="fork")
    with MultiprocExecutor(cfg) as ex:
        call = _sdk_call(ex) if config == "plain-sdk" else (lambda i: ex.collective_rpc("echo", args=(i,)))
        for i in range(200):
            call(i)
        lat = []
        for i in range(calls):
            start = time.perf_counter()
            call(i)
            lat.append(time.perf_counter() - start)
    print(json.dumps(lat))


def _sdk_call(ex: MultiprocExecutor) -> Any:
    from opentelemetry.propagate import inject

    tracer = _sdk_tracer("bench-driver")

    def call(i: int) -> Any:
        with tracer.start_as_current_span("rpc echo"):
            carrier: dict[str, str] = {}
            inject(carrier)
            return ex.collective_rpc("traced_echo", args=(i, carrier))

    return call


def _env(config: str, trace_dir: str, tree: Path = ROOT) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OTEL_", "FAULTLAB_TRACE_DIR"))}
    env["PYTHONPATH"] = os.pathsep.join([str(tree / "bench"), str(tree),
                                         env.get("PYTHONPATH", "")])
    if config in ("sampled-1%", "on-100%"):
        env["FAULTLAB_TRACE_DIR"] = tempfile.mkdtemp(dir=trace_dir)
        env["OTEL_TRACES_SAMPLER"] = "parentbased_traceidratio"
        env["OTEL_TRACES_SAMPLER_ARG"] = "0.01" if config == "sampled-1%" else "1.0"
    return env


def _run_child(config: str, calls: int, trace_dir: str, tree: Path = ROOT) -> list[float]:
    out = subprocess.run(
        [sys.executable, str(tree / "bench" / "bench_rpc_tracing.py"), "--child", config,
         "--calls", str(calls)],
        env=_env(config, trace_dir, tree), cwd=tree, capture_output=True, text=True,
        check=True, timeout=300,
    )
    return list(json.loads(out.stdout.strip().splitlines()[-1]))


def measure(rounds: int, calls: int, configs: tuple[str, ...] = CONFIGS,
            before_tree: Path | None = None) -> dict[str, list[float]]:
    """Per configuration, the median latency of each round (round-robin order); with
    ``before_tree``, also ``before:<configuration>`` from that checkout, in the same rounds."""
    runs = [(c, c, ROOT) for c in configs]
    if before_tree is not None:
        runs += [(f"before:{c}", c, before_tree) for c in configs]
    medians: dict[str, list[float]] = {key: [] for key, _, _ in runs}
    with tempfile.TemporaryDirectory() as trace_dir:
        for _ in range(rounds):
            for key, config, tree in runs:
                medians[key].append(statistics.median(_run_child(config, calls, trace_dir, tree)))
    return medians


def report(medians: dict[str, list[float]], rounds: int, calls: int) -> str:
    rows = []
    for key in medians:
        tree, _, config = key.rpartition(":")
        p50 = statistics.median(medians[key])
        base = statistics.median(medians[f"{tree}:off" if tree else "off"])
        rows.append([tree or "this tree", config, _stats.fmt_time(p50), f"{p50 / base:.2f}×",
                     " ".join(_stats.fmt_time(m) for m in medians[key])])
    table = _stats.markdown_table(
        ["tree", "configuration", "RPC p50", "vs its off", "per-round medians"], rows)
    facts = _stats.machine()
    return (
        f"Small broadcast RPC (`echo`, 2 fork workers), {rounds} rounds × {calls} calls per "
        f"configuration, each in its own driver process, round-robin. Target: 100 % sampling "
        f"≤ 1.25× off (aim 1.10×). Machine: {facts}.\n\n{table}\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", choices=CONFIGS)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out")
    parser.add_argument("--before-tree", type=Path,
                        help="a checkout of an earlier version, measured in the same rounds")
    parser.add_argument("--configs", default=",".join(CONFIGS),
                        help="comma-separated subset of " + ", ".join(CONFIGS) + " (off first)")
    args = parser.parse_args()
    if args.child:
        _child(args.child, args.calls)
        return
    rounds, calls = (2, 500) if args.quick else (args.rounds, args.calls)
    configs = tuple(c.strip() for c in args.configs.split(","))
    if configs[0] != "off" or not set(configs) <= set(CONFIGS):
        parser.error(f"--configs must start with off and name only {', '.join(CONFIGS)}")
    before = args.before_tree.resolve() if args.before_tree else None
    if before is not None and not (before / "bench" / "bench_rpc_tracing.py").is_file():
        parser.error(f"--before-tree {before}: no bench/bench_rpc_tracing.py there")
    text = report(measure(rounds, calls, configs, before), rounds, calls)
    print(text)
    if args.out:
        _stats.write_section(args.out, "Tracing overhead per RPC", text)


if __name__ == "__main__":
    main()
