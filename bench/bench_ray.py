"""RayExecutor against the shm executor and a Pipe baseline, in one run (issue 24).

    Pipe echo (2 forked peers) ─┐
    MultiprocExecutor (tp=2)    ├─ small-RPC latency (median of N), 1 MiB / 8 MiB echo, start-up
    LocalRayCluster (2 nodes) ──┘  then RayExecutor (tp=2, one rank per node): the same, and
                                   detection of an actor SIGKILL, a raylet SIGKILL, a SIGSTOPped
                                   node (fault to ExecutorFailedError in an in-flight call),
                                   and restart() after a death

The forked systems run first: forking after ray.init (gRPC threads) is not safe.  Numbers go
to bench/RESULTS.md, section "Ray (issue 24)", with the machine's load beside them.

    .venv/bin/python bench/bench_ray.py [--calls 300] [--kills 3]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from _roundtrip import PipeEcho  # noqa: E402
from _stats import fmt_time, machine, markdown_table, write_section  # noqa: E402

from executor import ExecutorConfig, ExecutorFailedError, MultiprocExecutor  # noqa: E402

MiB = 1 << 20


def median_call(call: Callable[[], Any], n: int) -> float:
    for _ in range(min(20, n)):
        call()
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        call()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def echo_costs(echo: Callable[[Any], Any], n: int) -> dict[str, float]:
    return {"small": median_call(lambda: echo((1, "x")), n),
            "1 MiB": median_call(lambda: echo(bytes(MiB)), max(10, n // 10)),
            "8 MiB": median_call(lambda: echo(bytes(8 * MiB)), max(5, n // 30))}


def forked_systems(n: int) -> dict[str, dict[str, float]]:
    pipe = PipeEcho(2)
    try:
        out = {"Pipe": echo_costs(pipe.echo, n)}
    finally:
        pipe.close()
    start = time.perf_counter()
    with MultiprocExecutor(ExecutorConfig(tensor_parallel_size=2)) as ex:
        startup = time.perf_counter() - start
        out["shm executor"] = {**echo_costs(lambda x: ex.collective_rpc("echo", args=(x,)), n),
                               "start-up": startup}
    for i in range(3):  # the same fault, for comparison: a worker's SIGKILL
        with MultiprocExecutor(ExecutorConfig(tensor_parallel_size=2)) as ex:
            pid = ex.worker_pids[1]
            out["shm executor"][f"kill {i}"] = detect(ex, lambda pid=pid: os.kill(pid, signal.SIGKILL))
    return out


def detect(ex: Any, fault: Callable[[], Any]) -> float:
    """Seconds from ``fault()`` to the in-flight call's ExecutorFailedError."""
    future = ex.collective_rpc("sleep", args=(300,), non_block=True)
    time.sleep(0.3)
    start = time.monotonic()
    fault()
    try:
        future.result(timeout=120)
    except ExecutorFailedError:
        return time.monotonic() - start
    raise AssertionError("the fault was not detected")


def ray_systems(n: int, kills: int) -> tuple[dict[str, float], dict[str, list[float]], float]:
    from executor.ray_cluster import LocalRayCluster
    from executor.ray_executor import RayExecutor

    with LocalRayCluster(nodes=2, cpus=2) as cluster:
        cfg = ExecutorConfig(tensor_parallel_size=2)
        start = time.perf_counter()
        ex = RayExecutor(cfg, address=cluster.address)
        costs = {**echo_costs(lambda x: ex.collective_rpc("echo", args=(x,)), n),
                 "start-up": time.perf_counter() - start, "cluster start-up": cluster.startup_s}
        detections: dict[str, list[float]] = {"actor SIGKILL": [], "raylet SIGKILL": [],
                                               "node SIGSTOP": []}
        restart_s = 0.0
        for i in range(kills):
            pid = ex.worker_pids[1]
            detections["actor SIGKILL"].append(detect(ex, lambda pid=pid: os.kill(pid, signal.SIGKILL)))
            begin = time.perf_counter()
            ex.restart("bench")
            restart_s = time.perf_counter() - begin if i == 0 else restart_s
        ex.shutdown()
        for fault in ("raylet SIGKILL", "node SIGSTOP"):
            ex = RayExecutor(cfg, address=cluster.address)
            node = cluster.node("node1")
            act = (lambda: cluster.kill_raylet("node1")) if fault == "raylet SIGKILL" else \
                (lambda node=node: node.signal_all(signal.SIGSTOP))
            detections[fault].append(detect(ex, act))
            ex.shutdown()
            node.signal_all(signal.SIGCONT)
            cluster.restart_node("node1")
        return costs, detections, restart_s


def report(forked: dict[str, dict[str, float]], ray_costs: dict[str, float],
           detections: dict[str, list[float]], restart_s: float, load: str) -> str:
    shm = forked["shm executor"]
    rows = []
    for case in ("small", "1 MiB", "8 MiB"):
        rows.append([f"echo {case} (tp=2)", fmt_time(forked["Pipe"][case]), fmt_time(shm[case]),
                     fmt_time(ray_costs[case]), f"{ray_costs[case] / shm[case]:.1f}x"])
    rows.append(["executor start-up", "", fmt_time(shm["start-up"]), fmt_time(ray_costs["start-up"]),
                 f"{ray_costs['start-up'] / shm['start-up']:.0f}x"])
    rows.append(["two-node cluster start-up", "", "", fmt_time(ray_costs["cluster start-up"]), ""])
    rows.append(["restart() after a death", "", "", fmt_time(restart_s), ""])
    table = markdown_table(["median", "Pipe", "shm executor", "RayExecutor", "Ray / shm"], rows)
    shm_kills = ", ".join(fmt_time(shm[f"kill {i}"]) for i in range(3))
    det = markdown_table(["fault (in-flight call)", "RayExecutor: detected after (each run)",
                          "shm executor"],
                         [[k, ", ".join(fmt_time(x) for x in v),
                           shm_kills if k == "actor SIGKILL" else "(no such fault)"]
                          for k, v in detections.items()])
    return (f"Measured {time.strftime('%Y-%m-%d %H:%M')} UTC, {load}; `bench/bench_ray.py`, "
            "all systems in one run (2 ranks; Ray: one actor per node of a two-node "
            "LocalRayCluster on loopback).\n\n" + table + "\n\n" + det + "\n\n"
            "Detection on Ray is Ray's: an actor's death reaches the driver through its "
            "`watch()` ref (GCS actor-state pubsub); a raylet's SIGKILL and a frozen node "
            "through the GCS health checks that tests and the demo tune to 300 ms x 3 "
            "(`RAY_health_check_*` in executor/ray_cluster.py; Ray's defaults take much longer). "
            "The shm executor's column is a worker's SIGKILL seen by its pidfd monitor.\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--out", default=str(HERE / "RESULTS.md"))
    args = parser.parse_args()
    load = machine().get("loadavg", "?")
    forked = forked_systems(args.calls)
    ray_costs, detections, restart_s = ray_systems(args.calls, args.kills)
    body = report(forked, ray_costs, detections, restart_s,
                  f"2 cores, load average {load} at the start, "
                  f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} at the end")
    print(body)
    write_section(args.out, "Ray (issue 24)", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
