"""Chaos benchmark: smoke-suite wall time, scenarios per minute, and detection latency per
fault kind (p50/p99) over repeated fail-fast scenarios.

    python bench/bench_chaos.py [--repeats N] [--out DIR]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from chaos import TABLE, FaultPlan, Outcome, run_scenario
from chaos.runner import run_suite
from chaos.suites import load_suite
from chaos.workloads import standard
from executor import ExecutorConfig


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def smoke(out: Path) -> tuple[float, int, int]:
    t0 = time.monotonic()
    results = run_suite(load_suite("smoke"), 1, out / "smoke")
    return time.monotonic() - t0, len(results), sum(not r.ok for r in results)


def latencies(out: Path, repeats: int) -> dict[str, list[float]]:
    cfg = ExecutorConfig(tensor_parallel_size=2, start_method="fork")
    by_kind: dict[str, list[float]] = defaultdict(list)
    rows = [(n, f) for n, f, o in TABLE if o == Outcome.FAIL_FAST]
    for i in range(repeats):
        for name, fault in rows:
            run_dir = out / f"lat-{i}-{name}".replace(" ", "_")
            r = run_scenario(cfg, standard, FaultPlan([fault], seed=i), run_dir)
            if r.detection_latency_s is not None:
                key = f"{fault.kind}" + ("" if fault.external else f" @{fault.phase}")
                if fault.kind == "corrupt_queue":
                    key = f"corrupt_queue {fault.mode} ({fault.queue})"  # type: ignore[attr-defined]
                by_kind[key].append(r.detection_latency_s)
    return by_kind


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="bench-chaos-"))
    wall, n, failed = smoke(out)
    print(f"smoke suite: {n} scenarios in {wall:.1f} s = {n / wall * 60:.0f} scenarios/min "
          f"({failed} with violations)")
    print("\n| fault (fork, TP=2) | n | detection p50 ms | p99 ms |\n|---|---|---|---|")
    for kind, values in sorted(latencies(out, args.repeats).items()):
        print(f"| {kind} | {len(values)} | {statistics.median(values) * 1e3:.1f} | "
              f"{percentile(values, 0.99) * 1e3:.1f} |")


if __name__ == "__main__":
    main()
