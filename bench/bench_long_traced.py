"""A long traced run: fds and RSS of the driver and of each worker over 1,000,000 traced RPCs.

    python bench/bench_long_traced.py                      # 1,000,000 RPCs, a sample every 100,000
    python bench/bench_long_traced.py --rpcs 300000 --every 50000

    parent ── FAULTLAB_TRACE_DIR=<temp dir> ──► child driver process (tracing is configured per
              process from the environment, so the child sees it from its first import)
    child  ── small blocking echo RPCs to 2 fork EchoWorkers (TP=2), every one traced (100 %)
           ── every K RPCs: psutil num_fds() and memory_info().rss of driver and workers,
              /proc/<pid>/status RssAnon, the trace dir's size on disk ──► one JSON line
    parent ◄── prints the table, deletes the trace dir

What it should show: fds and RSS stay flat however many RPCs have been traced.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for _p in (str(HERE), str(ROOT)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from _stats import machine, markdown_table  # noqa: E402

MiB = 1 << 20
WARMUP = 1000


def _anon_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0


def _disk_bytes(path: str) -> tuple[int, int]:
    """(bytes allocated on disk, number of files) under ``path`` (journals are sparse)."""
    total = files = 0
    for dirpath, _, names in os.walk(path):
        for name in names:
            try:
                total += os.stat(os.path.join(dirpath, name)).st_blocks * 512
                files += 1
            except FileNotFoundError:
                pass
    return total, files


def _sample(procs: list[Any], done: int, t0: float, trace_dir: str) -> dict[str, Any]:
    disk, files = _disk_bytes(trace_dir)
    return {
        "rpcs": done,
        "fds": [p.num_fds() for p in procs],
        "rss": [p.memory_info().rss for p in procs],
        "anon": [_anon_bytes(p.pid) for p in procs],
        "trace_bytes": disk,
        "trace_files": files,
        "elapsed": time.perf_counter() - t0,
    }


def child(rpcs: int, every: int) -> None:
    """The traced driver: runs in a process whose environment already names the trace dir."""
    import psutil

    import telemetry.config
    from executor import ExecutorConfig, MultiprocExecutor

    trace_dir = os.environ[telemetry.config.TRACE_DIR_ENV]
    if not telemetry.config.Settings.from_env().enabled:
        raise RuntimeError("tracing is off in the child")
    cfg = ExecutorConfig(worker="executor.workers:EchoWorker", tensor_parallel_size=2,
                         start_method="fork")
    with MultiprocExecutor(cfg) as ex:
        procs = [psutil.Process(), *(psutil.Process(pid) for pid in ex.worker_pids)]
        for i in range(WARMUP):
            ex.collective_rpc("echo", args=(i,))
        t0 = time.perf_counter()
        print(json.dumps(_sample(procs, 0, t0, trace_dir)), flush=True)
        done = 0
        while done < rpcs:
            n = min(every, rpcs - done)
            for i in range(done, done + n):
                ex.collective_rpc("echo", args=(i,))
            done += n
            reply = ex.collective_rpc("echo", args=(done,))  # one check per block, not counted
            if reply != [done, done]:
                raise AssertionError(f"wrong reply {reply!r}")
            print(json.dumps(_sample(procs, done, t0, trace_dir)), flush=True)


def _env(trace_dir: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "FAULTLAB_TRACE"))}
    env["FAULTLAB_TRACE_DIR"] = trace_dir
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(ROOT), env.get("PYTHONPATH", "")])
    return env


def _row(s: dict[str, Any]) -> list[str]:
    def mib(x: int) -> str:
        return f"{x / MiB:.1f}"

    return [
        f"{s['rpcs']:,}",
        str(s["fds"][0]),
        f"{mib(s['rss'][0])} ({mib(s['anon'][0])})",
        " / ".join(str(x) for x in s["fds"][1:]),
        " / ".join(f"{mib(r)} ({mib(a)})" for r, a in zip(s["rss"][1:], s["anon"][1:], strict=True)),
        f"{s['trace_bytes'] / MiB:,.0f} ({s['trace_files']})",
        f"{s['elapsed']:.1f}",
    ]


HEADER = ["RPCs done", "driver fds", "driver RSS MiB (anon)", "worker fds r0 / r1",
          "worker RSS MiB (anon) r0 / r1", "trace dir MiB (files)", "elapsed s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rpcs", type=int, default=1_000_000, help="traced RPCs (default 1,000,000)")
    parser.add_argument("--every", type=int, default=100_000, help="sample every K RPCs")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.every <= 0 or args.rpcs <= 0:
        parser.error("--rpcs and --every must be positive")
    if args.child:
        child(args.rpcs, args.every)
        return
    trace_dir = tempfile.mkdtemp(prefix="faultlab-long-traced-")
    samples: list[dict[str, Any]] = []
    try:
        proc = subprocess.Popen(
            [sys.executable, __file__, "--child", "--rpcs", str(args.rpcs), "--every", str(args.every)],
            env=_env(trace_dir), stdout=subprocess.PIPE, text=True, cwd=ROOT,
        )
        assert proc.stdout is not None
        with proc.stdout:
            for line in proc.stdout:
                samples.append(json.loads(line))
                print("  " + " | ".join(_row(samples[-1])), file=sys.stderr, flush=True)
        if proc.wait() != 0:
            raise SystemExit(f"child driver exited with code {proc.returncode}")
    finally:
        shutil.rmtree(trace_dir, ignore_errors=True)
    print(f"{args.rpcs:,} small blocking `echo` RPCs (TP=2, fork EchoWorkers), every one traced "
          f"(FAULTLAB_TRACE_DIR journal, 100 % sampling), after {WARMUP:,} warm-up calls; "
          f"RSS is psutil memory_info().rss, anon is RssAnon from /proc; trace dir deleted after "
          f"the run. Machine: {machine()}.\n")
    print(markdown_table(HEADER, (_row(s) for s in samples)))


if __name__ == "__main__":
    main()
