"""RayExecutor under faults of a Ray cluster, as a table (chaos/ray_faults.py): each fault
hits a call in flight, which must fail with ExecutorFailedError naming what died.

    fault         where                                expected
    kill_actor    SIGKILL rank 1's actor process       ExecutorFailedError: rank, pid, node
    term_actor    SIGTERM rank 1's actor process       ExecutorFailedError: rank, pid, node
    kill_raylet   SIGKILL node1's raylet (node death)  ExecutorFailedError: rank, "node1 ... died"
    stop_node     SIGSTOP every process of node1       ExecutorFailedError: rank, "node1 ... died"
    driver death  SIGKILL a driver (child process)     its actors gone (owner death), its CPUs
                                                       free again, the nodes stay
    demo kill     SIGKILL rank 1, --backend ray        restart; the tokens of the shm run
    traces        one traced call                      worker spans are the RPC span's children

These start Ray processes and node replacements (~2-3 min on two loaded cores), so they are
outside the default run: ``FAULTLAB_RAY_CHECKS=1 pytest tests/executor_tests/test_executor_ray_faults.py``
(README, "On Ray").  They share the session's two-node cluster (tests/conftest.py); a fault
that breaks a node is followed by a fresh node in its place.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import leaks
import pytest

from chaos.ray_faults import RAY_FAULTS, driver_death_orphans, free_cpus, run_ray_fault
from executor import ExecutorConfig

pytestmark = [
    pytest.mark.skipif(os.environ.get("FAULTLAB_RAY_CHECKS") != "1",
                       reason="Ray cluster faults: set FAULTLAB_RAY_CHECKS=1 (slow)"),
    pytest.mark.timeout(400),
]


@pytest.mark.parametrize("fault", sorted(RAY_FAULTS))
def test_a_fault_fails_the_call_in_flight_naming_what_died(ray_cluster: Any, fault: str) -> None:
    outcome = run_ray_fault(ray_cluster, ExecutorConfig(tensor_parallel_size=2), fault)
    for node in ray_cluster.nodes:  # a replaced node is the session's too
        leaks.exempt_tree(node.keeper.pid)
    assert outcome.violations == [], outcome
    assert outcome.detected and outcome.cause_named and outcome.callbacks == 1


def test_the_driver_s_death_takes_its_actors_but_not_the_nodes(ray_cluster: Any) -> None:
    pids, orphans = driver_death_orphans(ray_cluster)
    assert len(pids) == 2 and orphans == [], "actors outlived their driver (owner death)"
    assert all(node.raylet() is not None for node in ray_cluster.nodes)
    assert free_cpus(ray_cluster, 4.0) == 4.0, "the dead driver's placement group kept its CPUs"


def _demo(*args: str) -> dict[str, Any]:
    faultlab = os.path.join(os.path.dirname(sys.executable), "faultlab")
    out = subprocess.run([faultlab, "demo", "--tp", "2", "--requests", "3", "--max-tokens", "8",
                          "--json", *args], capture_output=True, text=True, timeout=300)
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
