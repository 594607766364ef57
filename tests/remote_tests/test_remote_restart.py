"""``ex.restart()`` across two nodes: node 1's ``faultlab worker`` agent survives its workers'
death and starts the new incarnation when the driver asks.

    fault                         then                       expected outcome
    SIGKILL a remote / local rank  ex.restart()               every rank answers; all pids new;
                                                              nothing old left on either node
    SIGKILL a rank mid-generation  engine (restart policy)    TP=2 across nodes: same tokens
    a reply of the old incarnation sent after the restart     dropped and counted, never delivered
    SIGKILL node 1's agent         ex.restart()               fails naming node 1, within its bound
"""

from __future__ import annotations

import os
import signal
import time

import leaks
import psutil
import pytest
import torch  # noqa: F401  (imported before any fork, as in tests/model)
import zmq
from conftest import FAST_LIVENESS, TwoNodes

from chaos import resources
from executor import ExecutorFailedError, MultiprocExecutor
from executor.exit_guard import GUARD_NAME
from executor.model.engine import LLMEngine
from executor.model.prompts import make_prompts
from executor.model.recovery import RESTART
from executor.serialization import encode
from executor.tcp_gate import present
from executor.tcp_wire import DATA, rank_identity, seal

# A gone agent is named once silent node_timeout (counted from the restart at the earliest);
# the rest is slack for a loaded machine: this guards against a hang, it is not a timing test.
GONE_BOUND_S = FAST_LIVENESS["node_timeout"] + 15


def _wait_failed(ex: MultiprocExecutor) -> None:
    deadline = time.monotonic() + 30
    while not ex.is_failed and time.monotonic() < deadline:
        time.sleep(0.02)
    assert ex.is_failed, "the executor never noticed the death"


def _node_pids(two_nodes: TwoNodes) -> list[int]:
    """Every process below node 1's agent but the workers' exit guards (its workers)."""
    return [p.pid for p in two_nodes.node_tree(two_nodes.nodes[-1])[1:] if not _is_guard(p)]


def _is_guard(proc: psutil.Process) -> bool:
    try:
        return proc.name() == GUARD_NAME.decode()
    except psutil.NoSuchProcess:
        return True  # gone (a guard ends with its worker): not a worker still on the node


def _gone(pids: list[int]) -> bool:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        alive = [p for p in pids if psutil.pid_exists(p)
                 and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("victim", [1, 0], ids=["remote-rank", "local-rank"])
def test_restart_after_a_worker_dies_starts_new_workers_on_both_nodes(
        two_nodes: TwoNodes, victim: int) -> None:
    ex = two_nodes.start()
    agent = two_nodes.nodes[-1].pid
    old = list(ex.worker_pids)
    os.kill(old[victim], signal.SIGKILL)
    _wait_failed(ex)
    ex.restart("a worker was killed")
    assert ex.incarnation == 1 and not ex.is_failed
    assert ex.collective_rpc("echo", args=(b"again",)) == [b"again", b"again"]
    new = ex.worker_pids
    assert not set(old) & set(new) and 0 not in new
    assert ex.collective_rpc("getpid") == new
    assert two_nodes.node_tree(two_nodes.nodes[-1])[0].pid == agent, "the agent was replaced"
    assert _node_pids(two_nodes) == new[1:], "an old worker is still on node 1"
    assert _gone(old)


def test_repeated_restarts_leave_no_process_or_fd_behind(two_nodes: TwoNodes) -> None:
    ex = two_nodes.start(restart_budget=3)
    agent = psutil.Process(two_nodes.nodes[-1].pid)
    seen: list[tuple[int, int]] = []
    for round_ in range(3):
        os.kill(ex.worker_pids[1], signal.SIGKILL)
        _wait_failed(ex)
        ex.restart(f"round {round_}")
        assert ex.collective_rpc("echo", args=(round_,)) == [round_, round_]
        assert _node_pids(two_nodes) == ex.worker_pids[1:]
        ours = {p.pid for p in resources.child_processes() if p.ppid() == os.getpid()
                and p.pid not in leaks.session_pids()}  # not a Ray cluster of the session
        assert ours == {agent.pid, ex.worker_pids[0]}  # session helpers (forkserver, ...) aside
        seen.append((len(os.listdir("/proc/self/fd")), agent.num_fds()))
    assert seen[1] == seen[2], f"fds grow with every restart (driver, agent): {seen}"
    assert ex.restarts_used == 3


def test_tp2_across_nodes_gives_the_same_tokens_after_a_restart(two_nodes: TwoNodes) -> None:
    prompts = make_prompts(seed=3, count=4, max_len=10, vocab_size=512)
    model = {"worker": "executor.model.worker:ModelWorker",
             "worker_kwargs": {"seed": 0, "collective_timeout_s": 30}}
    ex = two_nodes.start(**model)
    reference = LLMEngine(ex, step_timeout=30).generate(prompts, 10)
    engine = LLMEngine(ex, step_timeout=30, recovery=RESTART)
    for rid, prompt in prompts.items():
        engine.add_request(rid, prompt, 10)
    outputs: dict[str, list[int]] = {}
    killed = False
    while engine.has_unfinished():
        for request in engine.step():
            outputs[request.request_id] = list(request.output_token_ids)
        if engine.stats.steps == 4 and not killed:
            killed = True
            os.kill(ex.worker_pids[1], signal.SIGKILL)  # the remote rank, mid-generation
    assert killed and ex.incarnation == 1
    assert outputs == reference
    assert engine.recovery is not None and not engine.recovery.lost


def test_a_reply_of_the_old_incarnation_is_dropped_and_counted(two_nodes: TwoNodes) -> None:
    ex = two_nodes.start()
    old_key = ex._res.remote._hub.session_key(0)  # type: ignore[union-attr]
    os.kill(ex.worker_pids[1], signal.SIGKILL)
    _wait_failed(ex)
    ex.restart()
    future = ex.collective_rpc("sleep", args=(0.5,), non_block=True)
    # What the dead rank 1 would have sent late: authentic, but of incarnation 0.
    rpc_id = future.call.rpc_id  # delivered, it would answer the call in flight
    stale = seal(old_key, DATA, 1, rpc_id, [bytes(p) for p in encode(2, 1, "stale")], 0)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    try:
        sock.setsockopt(zmq.ROUTING_ID, rank_identity(1, 0))
        present(sock, old_key)  # all the dead rank held: its session key
        sock.connect(f"tcp://{ex.driver_address}")
        sock.send_multipart(stale)
        deadline = time.monotonic() + 10
        while ex.stale_messages < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        sock.close(linger=0)
        ctx.term()
    assert ex.stale_messages == 1 and ex.rejected_messages == 0
    assert future.result(timeout=30) == [0.5, 0.5]
    assert not ex.is_failed
    assert ex.collective_rpc("echo", args=("fresh",)) == ["fresh", "fresh"]


def test_a_node_whose_agent_is_gone_fails_the_restart_by_name(two_nodes: TwoNodes) -> None:
    ex = two_nodes.start(restart_budget=1)
    tree = _node_pids(two_nodes)
    two_nodes.nodes[-1].kill()  # the agent only: its workers leave on their death pipe
    two_nodes.nodes[-1].wait(10)
    _wait_failed(ex)
    start = time.monotonic()
    with pytest.raises(ExecutorFailedError, match=r"node 1 \(ranks \[1\]\) is gone") as info:
        ex.restart()
    assert time.monotonic() - start < GONE_BOUND_S
    assert "faultlab worker" in str(info.value) and "budget" in str(info.value)
    assert ex.is_failed and _gone(tree)
