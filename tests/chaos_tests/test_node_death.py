"""Node death (KillNode): node 1 is a separate process tree on loopback TCP, run by run_scenario.

    fault                       where it hits            expected
    kill node 1's tree          mid-call (sleep 1)       ExecutorFailedError naming node 1, within
                                                         a heartbeat or two (the connection closes)
    cut node 1's link (SIGSTOP) mid-call                 the same, within node_timeout + slack
    either, broken detection    (ignored loss / huge     the detection oracle reports a violation
                                node_timeout)

Every scenario must leave nothing: node 1's agent and workers are gone, no /dev/shm, fds, threads.
"""

from __future__ import annotations

import re

import psutil
import pytest
from helpers import real_violations

from chaos import Bounds, FaultPlan, KillNode, Outcome, run_scenario
from chaos.mutants import IgnoresLostNodes
from chaos.resources import wait_gone
from chaos.workloads import CallSpec, rpc_sequence
from executor import ExecutorConfig

HEARTBEAT_S, NODE_TIMEOUT_S = 0.1, 1.0
SLACK_S = 2 * HEARTBEAT_S + 0.5
# A killed node closes its connections: the next heartbeat's send finds them gone.
KILL_BOUND_S = 2 * HEARTBEAT_S + SLACK_S
# A stopped node keeps them open: only its silence tells, after node_timeout.
CUT_BOUND_S = NODE_TIMEOUT_S + SLACK_S
HIT = ("sleep", 1)
IN_FLIGHT = rpc_sequence([
    CallSpec("echo", ("warm-up",), timeout=10.0),
    CallSpec("sleep", (3.0,), timeout=10.0),  # in flight when the node goes
    CallSpec("echo", ("after",), timeout=2.0),
])


def _config(**overrides: object) -> ExecutorConfig:
    fields: dict[str, object] = {
        "tensor_parallel_size": 4, "nnodes": 2, "start_method": "fork", "startup_timeout": 60.0,
        "heartbeat_interval": HEARTBEAT_S, "node_timeout": NODE_TIMEOUT_S, **overrides}
    return ExecutorConfig(**fields)  # type: ignore[arg-type]


def _assert_node_gone(record: dict[str, object]) -> None:
    pids = record["pids"]
    # the agent, node 1's two workers, and each worker's exit guard (executor/exit_guard.py)
    assert isinstance(pids, list) and len(pids) == 5, pids
    assert wait_gone(pids, 2.0) == {}  # a guard goes a moment after its worker (reaped by init)


@pytest.mark.parametrize(("mode", "bound_s"), [("kill", KILL_BOUND_S), ("cut_link", CUT_BOUND_S)],
                         ids=["kill", "cut_link"])
def test_node_loss_fails_the_in_flight_call_within_its_bound(tmp_path, mode, bound_s):
    plan = FaultPlan([KillNode(node=1, on_call=HIT, mode=mode)], seed=3)
    result = run_scenario(_config(), IN_FLIGHT, plan, tmp_path, name=f"node-{mode}")
    assert real_violations(result) == []
    assert result.expected == result.outcome == Outcome.FAIL_FAST
    hit = result.calls[1]
    assert hit.error_type == "ExecutorFailedError"
    assert re.search(r"node 1 \(ranks \[2, 3\]\) is lost", hit.error)
    latency = result.detection_latency_s
    assert latency is not None and latency < bound_s
    if mode == "cut_link":  # nothing but the heartbeat timeout can see a silent link
        assert latency >= NODE_TIMEOUT_S - HEARTBEAT_S
    [record] = result.faults
    assert (record["kind"], record["node"], record["mode"]) == ("kill_node", 1, mode)
    _assert_node_gone(record)


@pytest.mark.parametrize("broken", ["ignores-lost-nodes", "huge-node-timeout"])
def test_a_broken_detection_is_reported(tmp_path, broken):
    if broken == "ignores-lost-nodes":
        cfg, executor_class, mode = _config(), IgnoresLostNodes, "kill"
    else:
        cfg, executor_class, mode = _config(node_timeout=30.0), None, "cut_link"
    workload = rpc_sequence([CallSpec("echo", ("warm-up",), timeout=10.0),
                             CallSpec("sleep", (0.2,), timeout=1.5)])
    plan = FaultPlan([KillNode(node=1, on_call=HIT, mode=mode)], seed=3)
    result = run_scenario(cfg, workload, plan, tmp_path, bounds=Bounds(detect_s=2.0),
                          **({"executor_class": executor_class} if executor_class else {}))
    assert "detection" in {v.invariant for v in result.violations}, result.violations
    assert not [v for v in result.violations if v.invariant == "leak"]
    _assert_node_gone(result.faults[0])


class _FailsToStart(IgnoresLostNodes):
    def __init__(self, cfg: ExecutorConfig) -> None:
        raise RuntimeError("chaos test: the executor does not start")


def test_a_failed_start_leaves_no_node_behind(tmp_path):
    plan = FaultPlan([KillNode(node=1, on_call=HIT)], seed=3)
    result = run_scenario(_config(), IN_FLIGHT, plan, tmp_path, executor_class=_FailsToStart)
    assert "does not start" in result.error
    agents = [p for p in psutil.Process().children(recursive=True)
              if "faultlab.cli" in " ".join(p.cmdline())]
    assert agents == []


def test_kill_node_needs_a_remote_node():
    from chaos import PlanError

    with pytest.raises(PlanError, match="node must be a remote node"):
        KillNode(node=0)
    with pytest.raises(PlanError, match="mode must be one of"):
        KillNode(mode="unplug")
