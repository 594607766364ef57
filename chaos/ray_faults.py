"""Faults of a Ray cluster, for ``RayExecutor``, and the oracles each one must satisfy.

    RAY_FAULTS[name]: what it breaks ─► deliver(cluster, executor, rank) ─► expected cause
    run_ray_fault(cluster, cfg, name):  RayExecutor ─► a call in flight ─► the fault
        ─► oracles: the call fails with ExecutorFailedError within DETECTED_WITHIN_S, naming
           the rank and the node (the pid too when a process died); the failure callbacks ran
           once; after shutdown no actor process is alive ─► a broken node is replaced
    driver_death_orphans(cluster): a driver in a child process, SIGKILLed with a call in
        flight ─► the actor processes that outlive it (Ray's owner death must take them all)
    free_cpus(cluster, want): the CPUs free again afterwards (its placement group released)

A row of ``RayFaultOutcome`` reads like a chaos target's row (fault, detected, latency,
cause named, orphans, violations).  The cluster is an ``executor.ray_cluster.LocalRayCluster``:
node faults need its node processes (a raylet to kill, a tree to stop).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from chaos.resources import process_state
from executor.config import ExecutorConfig
from executor.errors import ExecutorFailedError

DETECTED_WITHIN_S = 15.0  # GCS health checks every 300 ms, 3 misses, on a loaded machine
ACTORS_GONE_S = 30.0  # Ray's owner death: the GCS kills a dead driver's actors


@dataclasses.dataclass(frozen=True)
class RayFault:
    what: str
    deliver: Callable[[Any, Any, int], list[int]]  # (cluster, executor, rank) -> stopped pids
    names: str  # what the error must name: "pid" (a process died) or "node" (a node died)
    breaks_node: bool


def _signal_actor(sig: int) -> Callable[[Any, Any, int], list[int]]:
    def deliver(cluster: Any, ex: Any, rank: int) -> list[int]:
        os.kill(ex.worker_pids[rank], sig)
        return []
    return deliver


def _kill_raylet(cluster: Any, ex: Any, rank: int) -> list[int]:
    cluster.kill_raylet(ex.worker_nodes[rank])
    return []


def _stop_node(cluster: Any, ex: Any, rank: int) -> list[int]:
    return list(cluster.node(ex.worker_nodes[rank]).signal_all(signal.SIGSTOP))


RAY_FAULTS: dict[str, RayFault] = {
    "kill_actor": RayFault("SIGKILL to the rank's actor process", _signal_actor(signal.SIGKILL),
                           "pid", False),
    "term_actor": RayFault("SIGTERM to the rank's actor process", _signal_actor(signal.SIGTERM),
                           "pid", False),
    "kill_raylet": RayFault("SIGKILL to the raylet of the rank's node (a node death)",
                            _kill_raylet, "node", True),
    "stop_node": RayFault("SIGSTOP to every process of the rank's node (a frozen node)",
                          _stop_node, "node", True),
}


@dataclasses.dataclass
class RayFaultOutcome:
    fault: str
    rank: int
    node: str
    detected: bool = False
    detection_latency_s: float | None = None
    cause_named: bool = False
    error: str = ""
    callbacks: int = 0
    orphans: list[int] = dataclasses.field(default_factory=list)
    violations: list[str] = dataclasses.field(default_factory=list)


def run_ray_fault(cluster: Any, cfg: ExecutorConfig, name: str, rank: int = 1) -> RayFaultOutcome:
    """One scenario: ``RAY_FAULTS[name]`` on ``rank`` (for a node fault: a rank on a worker
    node) while a call is in flight."""
    from executor.ray_executor import RayExecutor

    fault = RAY_FAULTS[name]
    ex = RayExecutor(cfg, address=cluster.address)
    if fault.breaks_node:  # the head's raylet cannot be replaced: hit a worker node's rank
        rank = next((r for r, n in enumerate(ex.worker_nodes) if n != "node0"), rank)
    outcome = RayFaultOutcome(name, rank, ex.worker_nodes[rank])
    stopped: list[int] = []
    calls: list[int] = []
    try:
        ex.register_failure_callback(lambda: calls.append(1))
        future = ex.collective_rpc("sleep", args=(300,), non_block=True)
        time.sleep(0.3)
        pid, start = ex.worker_pids[rank], time.monotonic()
        stopped = fault.deliver(cluster, ex, rank)
        _judge(outcome, future, fault, pid, start)
        _wait(lambda: bool(calls), 10.0)
    finally:
        pids = ex.worker_pids
        ex.shutdown()
        for p in stopped:
            _signal_quietly(p, signal.SIGCONT)
        if fault.breaks_node:
            cluster.restart_node(outcome.node)
    outcome.callbacks = len(calls)
    if outcome.callbacks != 1:
        outcome.violations.append(f"the failure callbacks ran {outcome.callbacks} times, not once")
    outcome.orphans = _alive_after(pids, 10.0)
    if outcome.orphans:
        outcome.violations.append(f"actor processes {outcome.orphans} outlived shutdown()")
    return outcome


def _judge(outcome: RayFaultOutcome, future: Any, fault: RayFault, pid: int, start: float) -> None:
    try:
        future.result(timeout=DETECTED_WITHIN_S * 4)
    except ExecutorFailedError as exc:
        outcome.detected, outcome.error = True, str(exc)
        outcome.detection_latency_s = time.monotonic() - start
    except Exception as exc:  # noqa: BLE001 - any other outcome is the violation
        outcome.error = f"{type(exc).__name__}: {exc}"
    if not outcome.detected:
        outcome.violations.append(f"the call in flight did not fail with ExecutorFailedError: "
                                  f"{outcome.error or 'it returned'}")
        return
    latency = outcome.detection_latency_s or 0.0
    if latency > DETECTED_WITHIN_S:
        outcome.violations.append(f"detected after {latency:.1f} s (bound {DETECTED_WITHIN_S} s)")
    marks = [f"rank {outcome.rank} ", f"Ray node {outcome.node} "]
    marks.append(f"(pid {pid})" if fault.names == "pid" else "died with it")
    outcome.cause_named = all(m in outcome.error for m in marks)
    if not outcome.cause_named:
        outcome.violations.append(f"the error does not name {marks}: {outcome.error}")


_DRIVER = """
import sys, time
from executor import ExecutorConfig, RayExecutor
ex = RayExecutor(ExecutorConfig(tensor_parallel_size=2), address=sys.argv[1])
print(" ".join(map(str, ex.worker_pids)), flush=True)
ex.collective_rpc("sleep", args=(300,), non_block=True)
time.sleep(300)
"""


def driver_death_orphans(cluster: Any, within_s: float = ACTORS_GONE_S) -> tuple[list[int], list[int]]:
    """SIGKILL a driver (a child process) with a call in flight: (its actors' pids, those
    still alive ``within_s`` later)."""
    driver = subprocess.Popen([sys.executable, "-c", _DRIVER, cluster.address],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    pids: list[int] = []
    try:
        assert driver.stdout is not None
        timer = threading.Timer(300, driver.kill)  # a driver that never says READY
        timer.start()
        try:
            pids = [int(p) for p in driver.stdout.readline().split()]
        finally:
            timer.cancel()
    finally:
        driver.kill()
        driver.wait()
        if driver.stdout is not None:
            driver.stdout.close()
    return pids, _alive_after(pids, within_s)


_FREE_CPUS = """
import sys, time
import ray
ray.init(address=sys.argv[1], log_to_driver=False)
want, deadline = float(sys.argv[2]), time.monotonic() + float(sys.argv[3])
free = ray.available_resources().get("CPU", 0.0)
while free < want and time.monotonic() < deadline:
    time.sleep(0.2)
    free = ray.available_resources().get("CPU", 0.0)
print(free, flush=True)
"""


def free_cpus(cluster: Any, want: float, within_s: float = ACTORS_GONE_S) -> float:
    """The cluster's free CPUs once ``want`` are free again or ``within_s`` passed (asked from
    a fresh driver): a dead driver's placement groups and actors must give theirs back."""
    from executor.ray_cluster import RAY_ENV

    env = {**os.environ, **RAY_ENV}
    out = subprocess.run([sys.executable, "-c", _FREE_CPUS, cluster.address, str(want),
                          str(within_s)], capture_output=True, text=True, env=env,
                         timeout=within_s + 120)
    return float(out.stdout.split()[-1]) if out.returncode == 0 and out.stdout.split() else -1.0


def _alive_after(pids: list[int], wait_s: float) -> list[int]:
    deadline = time.monotonic() + wait_s
    while True:
        alive = [p for p in pids if process_state(p) == "alive"]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


def _wait(done: Callable[[], bool], wait_s: float) -> None:
    deadline = time.monotonic() + wait_s
    while not done() and time.monotonic() < deadline:
        time.sleep(0.05)


def _signal_quietly(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
