"""Remote workers: small-RPC and 1 MiB round trips, local shared memory vs remote TCP.

    executor A: nnodes=1, TP=2        rank 1 reached through the shm rings
    executor B: nnodes=2, TP=2        rank 1 on "node 1" (a separate process tree), reached
                                      through the TCP hub over loopback, HMAC on every message
    for each case: calls to rank 1 (unique_reply_rank=1) and broadcasts, A and B interleaved
    in blocks so that load from other processes hits both alike; medians and p99.

Run from the repository root: ``python bench/bench_remote.py [--n 400]``; ``--write``
replaces the "Remote" section of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from _stats import Summary, fmt_time, machine, markdown_table, text_table, write_section  # noqa: E402

from executor import ExecutorConfig, MultiprocExecutor  # noqa: E402
from executor.launch import free_loopback_port  # noqa: E402
from executor.tcp_wire import write_secret_file  # noqa: E402


def start_remote(secret_file: str) -> tuple[MultiprocExecutor, subprocess.Popen[bytes]]:
    port = free_loopback_port()
    node = subprocess.Popen(
        [sys.executable, "-m", "faultlab.cli", "worker", "--driver", f"127.0.0.1:{port}",
         "--node-rank", "1", "--secret-file", secret_file],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stderr=subprocess.DEVNULL,
    )
    cfg = ExecutorConfig(tensor_parallel_size=2, nnodes=2, driver_port=port, start_method="fork",
                         secret_file=secret_file)
    return MultiprocExecutor(cfg), node


def interleaved(runners: dict[str, Callable[[], Any]], n: int, block: int = 20) -> dict[str, Summary]:
    samples: dict[str, list[float]] = {name: [] for name in runners}
    for run in runners.values():
        for _ in range(10):
            run()  # warm up
    for _ in range(0, n, block):
        for name, run in runners.items():
            for _ in range(block):
                t = time.perf_counter()
                run()
                samples[name].append(time.perf_counter() - t)
    return {name: Summary.of(xs) for name, xs in samples.items()}


def cases(local: MultiprocExecutor, remote: MultiprocExecutor) -> list[tuple[str, dict[str, Any]]]:
    mib = os.urandom(1 << 20)

    def call(ex: MultiprocExecutor, arg: Any, rank: int | None) -> Callable[[], Any]:
        return lambda: ex.collective_rpc("echo", args=(arg,), unique_reply_rank=rank)

    return [
        (f"small RPC to rank 1{suffix}", {"shm": call(local, 1, rank), "tcp": call(remote, 1, rank)})
        for suffix, rank in (("", 1), (" (broadcast, both reply)", None))
    ] + [
        (f"1 MiB echo to rank 1{suffix}", {"shm": call(local, mib, rank), "tcp": call(remote, mib, rank)})
        for suffix, rank in (("", 1), (" (broadcast, both reply)", None))
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=400, help="samples per case and transport")
    parser.add_argument("--write", action="store_true", help="update bench/RESULTS.md")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        secret_file = os.path.join(tmp, "secret")
        write_secret_file(secret_file, secrets.token_bytes(32))
        local = MultiprocExecutor(ExecutorConfig(tensor_parallel_size=2, start_method="fork"))
        remote, node = start_remote(secret_file)
        try:
            rows = []
            for name, runners in cases(local, remote):
                n = args.n if "small" in name else max(50, args.n // 4)
                s = interleaved(runners, n)
                rows.append([name, str(s["shm"].n), fmt_time(s["shm"].p50), fmt_time(s["tcp"].p50),
                             f"{s['tcp'].p50 / s['shm'].p50:.1f}x", fmt_time(s["shm"].p99),
                             fmt_time(s["tcp"].p99)])
        finally:
            # Remote first: its forked worker inherited the local executor's death-pipe end.
            remote.shutdown()
            node.wait(10)
            local.shutdown()
    header = ["case (TP=2, fork)", "n", "shm p50", "tcp p50", "tcp/shm", "shm p99", "tcp p99"]
    print(text_table(header, rows))
    if args.write:
        m = machine()
        body = (f"`python bench/bench_remote.py --n {args.n}` ({m['nproc']} cores, "
                f"{m.get('python', '')}). Rank 1 local (shared-memory rings) vs on a second "
                "\"node\" (separate process tree, ZeroMQ over loopback TCP, HMAC-SHA256 on every "
                "message, through the driver's hub thread and the worker's link thread).\n\n"
                + markdown_table(header, rows) + "\n")
        write_section(ROOT / "bench" / "RESULTS.md", "Remote", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
