"""How long workers outlive a SIGKILLed driver, by what their main thread is doing.

    driver subprocess ─► TP=2 executor ─► workers idle | sleeping in a method | SIGSTOPped |
                         in GIL-holding C code (sum(range)) | in a backtracking regex
    bench ── SIGKILL the driver ──► poll both worker pids every 1 ms ──► time until both gone

The promise (README): every worker gone within 200 ms whatever its main thread does.  The
worker's own watcher thread ends it ~100 ms after the death pipe's EOF when it can get the
GIL; the exit guard (executor/exit_guard.py) SIGKILLs it 10 ms after that when it cannot.

    python bench/bench_driver_death.py [--runs 5] [--start-method fork]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

sys.path.insert(0, os.path.dirname(__file__))
from _stats import markdown_table, percentile, write_section

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).with_name("RESULTS.md")
DRIVER = r"""
import json, sys, time
from executor import ExecutorConfig, MultiprocExecutor

if __name__ == "__main__":
    start_method, mode = sys.argv[1], sys.argv[2]
    ex = MultiprocExecutor(ExecutorConfig(tensor_parallel_size=2, start_method=start_method))
    if mode == "sleeping":
        ex.collective_rpc("sleep", args=(120,), non_block=True)
    elif mode == "gil_c_code":
        ex.collective_rpc(lambda w: sum(range(10**12)), non_block=True)
    elif mode == "regex":
        ex.collective_rpc(lambda w: __import__("re").match(r"(a+)+$", "a" * 64 + "b"), non_block=True)
    print(json.dumps(ex.worker_pids), flush=True)
    time.sleep(120)
"""
MODES = ("idle", "sleeping", "stopped", "gil_c_code", "regex")


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def one_run(mode: str, start_method: str) -> float:
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, start_method,
                               "idle" if mode == "stopped" else mode],
                              stdout=subprocess.PIPE, text=True, cwd=ROOT)
    pids = json.loads(driver.stdout.readline())  # type: ignore[union-attr]
    time.sleep(0.3)  # let a busy worker enter its method
    if mode == "stopped":
        os.kill(pids[1], signal.SIGSTOP)
    start = time.monotonic()
    driver.kill()
    while any(_alive(p) for p in pids) and time.monotonic() - start < 30:
        time.sleep(0.001)
    gone = time.monotonic() - start
    driver.wait()
    driver.stdout.close()  # type: ignore[union-attr]
    for pid in pids:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    return gone


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--start-method", default="fork")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = parser.parse_args()
    rows = []
    for mode in MODES:
        samples = [one_run(mode, args.start_method) for _ in range(args.runs)]
        rows.append([mode, f"{percentile(samples, 50) * 1e3:.0f} ms", f"{max(samples) * 1e3:.0f} ms"])
    table = markdown_table(["worker's main thread", "gone after (p50)", "max"], rows)
    print(table)
    if not args.no_write:
        write_section(RESULTS, "Workers after a driver SIGKILL",
                      f"`python bench/bench_driver_death.py --runs {args.runs} --start-method "
                      f"{args.start_method}`: time from the driver's SIGKILL until both workers of a "
                      "TP=2 executor are gone (polled every 1 ms).\n\n" + table + "\n")


if __name__ == "__main__":
    main()
