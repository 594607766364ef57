"""A node that dies is detected within its bound; the driver going away ends the node."""

from __future__ import annotations

import threading
import time

import psutil
import pytest
from conftest import FAST_LIVENESS, TwoNodes

from executor import ExecutorFailedError, MultiprocExecutor

# EHOSTUNREACH on the next heartbeat finds a closed connection; silence takes node_timeout.
DETECTION_BOUND_S = FAST_LIVENESS["node_timeout"] + 2 * FAST_LIVENESS["heartbeat_interval"] + 0.5


def _kill_tree(two_nodes: TwoNodes) -> float:
    tree = two_nodes.node_tree(two_nodes.nodes[-1])
    killed = time.monotonic()
    for proc in tree:
        proc.kill()
    return killed


def _failed_within(ex: MultiprocExecutor, calls: list[float], bound: float) -> None:
    deadline = time.monotonic() + bound + 5
    while not calls and time.monotonic() < deadline:
        time.sleep(0.01)
    assert calls, "the failure callback never ran"


@pytest.mark.parametrize("victims", ["tree", "workers"])
def test_killing_node_1_is_detected_within_its_bound(two_nodes: TwoNodes, victims: str) -> None:
    ex = two_nodes.start(tensor_parallel_size=4)
    calls: list[float] = []
    ex.register_failure_callback(lambda: calls.append(time.monotonic()))
    in_flight = ex.collective_rpc("sleep", args=(30,), non_block=True)
    time.sleep(0.2)
    tree = two_nodes.node_tree(two_nodes.nodes[-1])
    targets = tree if victims == "tree" else tree[1:]
    killed = time.monotonic()
    for proc in targets:
        proc.kill()
    _failed_within(ex, calls, DETECTION_BOUND_S)
    assert calls[0] - killed < DETECTION_BOUND_S
    with pytest.raises(ExecutorFailedError, match=r"node 1 \(ranks \[2, 3\]\)"):
        in_flight.result(timeout=5)
    with pytest.raises(ExecutorFailedError, match="node 1"):
        ex.collective_rpc("echo", args=(1,))
    assert ex.is_failed and len(calls) == 1
    ex.shutdown()
    assert len(calls) == 1


def test_driver_shutdown_ends_the_remote_node_promptly(two_nodes: TwoNodes) -> None:
    ex = two_nodes.start(tensor_parallel_size=4)
    remote = [psutil.Process(pid) for pid in ex.worker_pids[2:]]
    start = time.monotonic()
    ex.shutdown()
    assert two_nodes.nodes[-1].wait(10) == 0
    assert time.monotonic() - start < 5
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in remote)


def test_a_remote_node_that_never_comes_fails_startup_cleanly(tmp_path: object) -> None:
    from executor import ExecutorConfig, WorkerStartupError
    from executor.launch import free_loopback_port

    cfg = ExecutorConfig(tensor_parallel_size=2, nnodes=2, driver_port=free_loopback_port(),
                         start_method="fork", startup_timeout=1.0, **FAST_LIVENESS)
    start = time.monotonic()
    with pytest.raises(WorkerStartupError, match=r"remote worker\(s\) \[1\] did not report READY"):
        MultiprocExecutor(cfg)
    assert time.monotonic() - start < 5
    assert not [t for t in threading.enumerate() if t.name.startswith("faultlab-")]
