"""Two "nodes" on one machine: this process is the driver (node 0, its workers local); node 1
is a separate process tree, ``python -m faultlab.cli worker --driver 127.0.0.1:PORT
--node-rank 1``, whose workers reach the driver over loopback TCP.  Never any other address.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from executor import ExecutorConfig, MultiprocExecutor
from executor.launch import free_loopback_port
from executor.tcp_wire import write_secret_file

REPO = Path(__file__).resolve().parents[2]
FAST_LIVENESS = {"heartbeat_interval": 0.2, "node_timeout": 2.0}


class TwoNodes:
    """Starts node 1's process tree, then the driver; stops both, whatever happened."""

    def __init__(self, tmp_path: Path) -> None:
        self.secret_file = str(tmp_path / "secret")
        write_secret_file(self.secret_file, secrets.token_bytes(32))
        self.executors: list[MultiprocExecutor] = []
        self.nodes: list[subprocess.Popen[bytes]] = []
        self.executor_class: type[MultiprocExecutor] = MultiprocExecutor  # or a chaos mutant

    def start(self, **overrides: object) -> MultiprocExecutor:
        port = free_loopback_port()
        self.nodes.append(self.start_node(port))
        fields: dict[str, object] = {
            "tensor_parallel_size": 2, "nnodes": 2, "driver_port": port, "start_method": "fork",
            "secret_file": self.secret_file, "startup_timeout": 60.0, **FAST_LIVENESS, **overrides,
        }
        ex = self.executor_class(ExecutorConfig(**fields))  # type: ignore[arg-type]
        self.executors.append(ex)
        return ex

    def start_node(self, port: int, node_rank: int = 1) -> subprocess.Popen[bytes]:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        return subprocess.Popen(
            [sys.executable, "-m", "faultlab.cli", "worker", "--driver", f"127.0.0.1:{port}",
             "--node-rank", str(node_rank), "--secret-file", self.secret_file,
             "--connect-timeout", "60"],
            cwd=REPO, env=env,
        )

    def node_tree(self, node: subprocess.Popen[bytes]) -> list[psutil.Process]:
        root = psutil.Process(node.pid)
        return [root, *root.children(recursive=True)]

    def close(self) -> None:
        for ex in self.executors:
            ex.shutdown()
        for node in self.nodes:
            try:
                node.wait(15)
            except subprocess.TimeoutExpired:
                for proc in self.node_tree(node):
                    proc.kill()
                node.wait(5)
                raise AssertionError("node 1 did not exit after the driver shut down") from None


@pytest.fixture
def two_nodes(tmp_path: Path) -> Iterator[TwoNodes]:
    nodes = TwoNodes(tmp_path)
    try:
        yield nodes
    finally:
        nodes.close()


@pytest.fixture
def remote_executor(two_nodes: TwoNodes) -> MultiprocExecutor:
    """Rank 0 local, rank 1 on node 1."""
    return two_nodes.start()


MakeExecutor = Callable[..., MultiprocExecutor]
