"""Calls in flight: throughput and per-call latency with 1, 10, 100 and 10,000 outstanding RPCs.

    python bench/bench_inflight.py            # full run (~2-4 min on 2 cores)
    python bench/bench_inflight.py --quick    # sanity run (< ~1 min)

    driver ── collective_rpc("echo", (x,), non_block=True) ──► window of N futures ──► 2 EchoWorkers
           ◄── oldest future's result() (futures resolve in submission order) ── submit the next

One TP=2 EchoWorker executor (fork).  For each payload (a small int, 64 KiB of bytes) and each
window N, ``--calls`` calls are made: N are submitted, then each time the oldest future's
result is in, another is submitted, until all calls are done.  Latency is submit → result()
returned, per call; throughput is calls / (first submit → last result).  The baseline, in the
same run, is 1 in flight with plain blocking calls.  Configurations run round-robin for
``--rounds`` rounds so that load from others on a shared machine hits them alike: throughput
is the median of the rounds, latency percentiles are over every call of every round.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for _p in (str(HERE), str(ROOT)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from _stats import fmt_time, machine, markdown_table, percentile  # noqa: E402

from executor import ExecutorConfig, MultiprocExecutor  # noqa: E402

ECHO = "executor.workers:EchoWorker"
KiB = 1 << 10
WINDOWS = (1, 10, 100, 10_000)
now = time.perf_counter


@dataclasses.dataclass(frozen=True)
class Plan:
    calls: int = 20_000  # per configuration and round
    rounds: int = 3
    warmup: int = 200


FULL = Plan()
QUICK = Plan(calls=12_000, rounds=1, warmup=100)


@dataclasses.dataclass
class Result:
    throughputs: list[float] = dataclasses.field(default_factory=list)  # calls/s, one per round
    latencies: list[float] = dataclasses.field(default_factory=list)  # seconds, every call


def payloads() -> dict[str, Any]:
    return {"small (int)": 12345, "64 KiB bytes": os.urandom(64 * KiB)}


def run_blocking(ex: MultiprocExecutor, x: Any, calls: int, lat: list[float]) -> tuple[float, Any]:
    """The baseline: one call at a time, blocking.  Returns (elapsed s, last reply)."""
    reply: Any = None
    t_start = now()
    for _ in range(calls):
        t0 = now()
        reply = ex.collective_rpc("echo", args=(x,))
        lat.append(now() - t0)
    return now() - t_start, reply


def run_window(ex: MultiprocExecutor, x: Any, calls: int, window: int,
               lat: list[float]) -> tuple[float, Any]:
    """Keep ``window`` non-blocking calls outstanding.  Returns (elapsed s, last reply)."""
    outstanding: collections.deque[tuple[float, Any]] = collections.deque()
    submitted = 0
    reply: Any = None
    t_start = now()
    while submitted < min(window, calls):
        outstanding.append((now(), ex.collective_rpc("echo", args=(x,), non_block=True)))
        submitted += 1
    while outstanding:
        t0, fut = outstanding.popleft()  # the oldest: futures resolve in submission order
        reply = fut.result()
        lat.append(now() - t0)
        if submitted < calls:
            outstanding.append((now(), ex.collective_rpc("echo", args=(x,), non_block=True)))
            submitted += 1
    return now() - t_start, reply


def measure(plan: Plan) -> dict[tuple[str, str], Result]:
    configs: list[tuple[str, Callable[..., tuple[float, Any]], int]] = [("1, blocking (baseline)",
                                                                         run_blocking, 1)]
    configs += [(f"{n:,}, non_block", run_window, n) for n in WINDOWS]
    results: dict[tuple[str, str], Result] = {}
    cfg = ExecutorConfig(worker=ECHO, tensor_parallel_size=2, start_method="fork")
    with MultiprocExecutor(cfg) as ex:
        for pname, x in payloads().items():
            expected = [x, x]
            assert ex.collective_rpc("echo", args=(x,)) == expected
            for _ in range(plan.warmup):
                ex.collective_rpc("echo", args=(x,))
            for r in range(plan.rounds):
                order = configs[r % len(configs):] + configs[:r % len(configs)]  # rotate
                for cname, fn, n in order:
                    res = results.setdefault((pname, cname), Result())
                    args = (ex, x, plan.calls) if fn is run_blocking else (ex, x, plan.calls, n)
                    elapsed, reply = fn(*args, res.latencies)
                    if reply != expected:
                        raise AssertionError(f"{pname}, {cname}: wrong reply")
                    res.throughputs.append(plan.calls / elapsed)
    return results


def report(plan: Plan, results: dict[tuple[str, str], Result]) -> str:
    rows = []
    for pname in payloads():
        base = statistics.median(results[(pname, "1, blocking (baseline)")].throughputs)
        for (p, cname), res in results.items():
            if p != pname:
                continue
            tput = statistics.median(res.throughputs)
            rows.append([pname, cname, f"{tput:,.0f}", f"{tput / base:.2f}×",
                         fmt_time(percentile(res.latencies, 50)),
                         fmt_time(percentile(res.latencies, 99)),
                         " ".join(f"{t:,.0f}" for t in res.throughputs)])
    table = markdown_table(["payload", "calls in flight", "calls/s (median)", "vs blocking",
                            "latency p50", "latency p99", "calls/s per round"], rows)
    facts = machine()
    return (f"TP=2 EchoWorker executor (fork), `echo` broadcast to both workers; "
            f"{plan.calls:,} calls per configuration per round, {plan.rounds} round(s), "
            f"round-robin; warm-up {plan.warmup} calls per payload. Machine: {facts}.\n\n"
            f"{table}\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short run (1 round, 12,000 calls)")
    parser.add_argument("--calls", type=int, help="calls per configuration per round")
    parser.add_argument("--rounds", type=int)
    args = parser.parse_args()
    plan = QUICK if args.quick else FULL
    if args.calls is not None:
        plan = dataclasses.replace(plan, calls=args.calls)
    if args.rounds is not None:
        plan = dataclasses.replace(plan, rounds=args.rounds)
    print(report(plan, measure(plan)))


if __name__ == "__main__":
    main()
