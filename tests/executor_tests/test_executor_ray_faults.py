"""RayExecutor under faults of a Ray cluster: a table of fault -> detection, with the cause
named, plus the model on Ray and the traces of Ray workers.

    fault                          where                   expected
    SIGKILL an actor's process     rank 1                  ExecutorFailedError: rank, pid, node
    SIGKILL a node's raylet        node1 (a node death)    ExecutorFailedError naming node1
    SIGSTOP every process of node  node1 (a frozen node)   ExecutorFailedError naming node1
    SIGKILL the driver             a driver in a child     its actors gone, the nodes stay
    SIGKILL a worker of the demo   rank 1, --backend ray   restart; tokens == the shm run's

These start Ray processes and node replacements (~2-3 min on two loaded cores), so they are
outside the default run: ``FAULTLAB_RAY_CHECKS=1 pytest tests/executor_tests/test_executor_ray_faults.py``
(README, "Ray").  They share the session's two-node cluster (tests/conftest.py); a test that
breaks a node starts a fresh one in its place.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import leaks
import pytest

from executor import ExecutorConfig, ExecutorFailedError

pytestmark = [
    pytest.mark.skipif(os.environ.get("FAULTLAB_RAY_CHECKS") != "1",
                       reason="Ray cluster faults: set FAULTLAB_RAY_CHECKS=1 (slow)"),
    pytest.mark.timeout(400),
]
DETECTED_WITHIN_S = 15.0  # GCS health checks every 300 ms, 3 misses; slack for a loaded machine


@pytest.fixture
def ray_executor(ray_cluster: Any) -> Iterator[Any]:
    from executor import RayExecutor

    ex = RayExecutor(ExecutorConfig(tensor_parallel_size=2), address=ray_cluster.address)
    yield ex
    pids = ex.worker_pids
    ex.shutdown()
    assert leaks.wait_gone(pids, 10.0) == []


def _fresh_node(cluster: Any, name: str) -> None:
    node = cluster.restart_node(name)
    leaks.exempt_tree(node.keeper.pid)


def _rank_on(ex: Any, node: str) -> int:
    assert node in ex.worker_nodes, f"no rank on {node}: {ex.worker_nodes}"
    return int(ex.worker_nodes.index(node))


def test_a_killed_actor_process_is_named_by_rank_pid_and_node(ray_executor: Any) -> None:
    called: list[int] = []
    ray_executor.register_failure_callback(lambda: called.append(1))
    future = ray_executor.collective_rpc("sleep", args=(120,), non_block=True)
    pid, node = ray_executor.worker_pids[1], ray_executor.worker_nodes[1]
    start = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(ExecutorFailedError, match=rf"rank 1 \(pid {pid}\) died, on Ray node {node}"):
        future.result(timeout=60)
    assert time.monotonic() - start < DETECTED_WITHIN_S
    with pytest.raises(ExecutorFailedError):
        ray_executor.collective_rpc("echo", args=(1,))
    deadline = time.monotonic() + 10
    while not called and time.monotonic() < deadline:
        time.sleep(0.05)
    assert called == [1]


@pytest.mark.parametrize("fault", ["kill_raylet", "sigstop_node"])
def test_a_lost_node_is_detected_and_named(ray_cluster: Any, ray_executor: Any, fault: str) -> None:
    rank = _rank_on(ray_executor, "node1")
    future = ray_executor.collective_rpc("sleep", args=(120,), non_block=True)
    time.sleep(0.3)
    start = time.monotonic()
    stopped: list[int] = []
    try:
        if fault == "kill_raylet":
            ray_cluster.kill_raylet("node1")
        else:
            stopped = ray_cluster.node("node1").signal_all(signal.SIGSTOP)
        named = rf"rank {rank} .*Ray node node1 .*died with it"
        with pytest.raises(ExecutorFailedError, match=named) as info:
            future.result(timeout=60)
        assert time.monotonic() - start < DETECTED_WITHIN_S
        assert info.value.node == 1 and info.value.rank == rank
    finally:
        for pid in stopped:
            _signal_quietly(pid, signal.SIGCONT)
        _fresh_node(ray_cluster, "node1")


DRIVER = """
import sys, time
from executor import ExecutorConfig, RayExecutor
ex = RayExecutor(ExecutorConfig(tensor_parallel_size=2), address=sys.argv[1])
print(" ".join(map(str, ex.worker_pids)), flush=True)
ex.collective_rpc("sleep", args=(300,), non_block=True)
time.sleep(300)
"""


def test_the_driver_s_death_takes_its_actors_but_not_the_nodes(ray_cluster: Any) -> None:
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, ray_cluster.address],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert driver.stdout is not None
        pids = [int(p) for p in driver.stdout.readline().split()]
        assert len(pids) == 2
    finally:
        driver.kill()
        driver.wait()
        if driver.stdout is not None:
            driver.stdout.close()
    assert leaks.wait_gone(pids, 30.0) == [], "actors outlived their driver (owner death)"
    assert all(node.raylet() is not None for node in ray_cluster.nodes)


def _demo(*args: str) -> dict[str, Any]:
    faultlab = os.path.join(os.path.dirname(sys.executable), "faultlab")
    out = subprocess.run([faultlab, "demo", "--tp", "2", "--requests",
                          "3", "--max-tokens", "8", "--json", *args],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return dict(json.loads(out.stdout))


def test_the_model_on_ray_recovers_a_killed_worker_with_the_shm_tokens(ray_cluster: Any) -> None:
    shm = _demo("--no-fault")
    on_ray = _demo("--backend", "ray", "--ray-address", ray_cluster.address, "--fault", "kill",
                   "--fault-rank", "1")
    assert on_ray["outputs"] == shm["outputs"]
    assert on_ray["recovery"]["tokens_match"] and on_ray["recovery"]["incarnation"] == 1
    assert "died" in json.dumps(on_ray["recovery"]["timeline"])


TRACED = """
import sys
from executor import ExecutorConfig, RayExecutor
with RayExecutor(ExecutorConfig(tensor_parallel_size=2), address=sys.argv[1]) as ex:
    ex.collective_rpc("echo", args=(b"traced",))
"""


def test_ray_workers_spans_join_the_driver_s_trace(ray_cluster: Any, tmp_path: Any) -> None:
    import telemetry

    env = {**os.environ, "FAULTLAB_TRACE_DIR": str(tmp_path)}
    subprocess.run([sys.executable, "-c", TRACED, ray_cluster.address], env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=200)
    spans = telemetry.load_run(str(tmp_path))
    rpc = spans[spans["name"] == "rpc echo"]
    assert len(rpc) == 1
    served = spans[spans["name"] == "worker.execute echo"]
    assert sorted(served["rank"]) == [0, 1]
    assert set(served["trace_id"]) == set(rpc["trace_id"])
    assert set(served["parent_span_id"]) == set(rpc["span_id"])


def _signal_quietly(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
