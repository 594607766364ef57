"""The remote nodes of a scenario (``nnodes > 1``): ``faultlab worker`` agents on loopback.

    RemoteNodes(cfg, dir).start() ─► DIR/secret (0600, fresh) + a free loopback port
        └─► node k = 1 .. nnodes-1: python -m faultlab.cli worker --driver 127.0.0.1:PORT
                                     --node-rank k --secret-file DIR/secret  (log: DIR/node-k.log)
    executor_class(nodes.config) ─► each agent fetches the config, forks its node's workers
    tree_pids(k)                 ─► the agent and all its descendants (what KillNode hits)
    kill_agent(k), start_agent(k) ─► SIGKILL node k's tree and reap its agent; a fresh agent
                                    for node k rejoins the driver by HELLO (chaos.recovery)
    wait_exit(s) after shutdown  ─► a healthy node leaves by itself once the driver is gone
    close()                      ─► SIGKILL whatever is left, reap the agents: never an orphan
    flood_outsider(OutsiderFlood) ─► a process without the secret streams huge frames at the
                                    driver's port (chaos.surroundings.flood_node_port) while a
                                    MemoryWatch samples the driver's RSS: OutsiderReport, whose
                                    violations say the driver buffered what it should refuse
    outsider_flood(ex)           ─► a scenario workload (suite: workload = "chaos.nodes:outsider_
                                    flood", nnodes > 1): the flood beside authentic calls, judged
                                    by the declared-outcome oracle (check "outsider")

With ``nnodes == 1`` every step does nothing and ``config`` is the scenario's own.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from chaos.surroundings import OUTSIDER_MODES, MemoryWatch
from executor import ExecutorConfig
from executor.launch import free_loopback_port
from executor.tcp_wire import write_secret_file

if TYPE_CHECKING:
    from chaos.recording import RecordingExecutor

REPO = Path(__file__).resolve().parents[1]


class RemoteNodes:
    """Starts, finds and ends the agents of nodes 1 .. nnodes-1."""

    def __init__(self, cfg: ExecutorConfig, directory: Path) -> None:
        self.config = cfg
        self.directory = directory
        self.agents: dict[int, subprocess.Popen[bytes]] = {}  # node -> agent
        self.ended: list[int] = []  # pids of the agents (and their trees) kill_agent ended

    def start(self) -> None:
        if self.config.nnodes == 1:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        secret_file = self.directory / "secret"
        secret_file.unlink(missing_ok=True)
        write_secret_file(str(secret_file), secrets.token_bytes(32))
        self.config = dataclasses.replace(self.config, driver_host="127.0.0.1",
                                          driver_port=free_loopback_port(),
                                          secret_file=str(secret_file))
        for node in range(1, self.config.nnodes):
            self.agents[node] = self._start_agent(node)

    def _start_agent(self, node: int) -> subprocess.Popen[bytes]:
        cfg = self.config
        path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
        with open(self.directory / f"node-{node}.log", "ab") as log:
            return subprocess.Popen(
                [sys.executable, "-m", "faultlab.cli", "worker", "--driver",
                 f"127.0.0.1:{cfg.driver_port}", "--node-rank", str(node),
                 "--secret-file", str(cfg.secret_file),
                 "--connect-timeout", str(cfg.startup_timeout)],
                cwd=REPO, env={**os.environ, "PYTHONPATH": path}, stdout=log, stderr=log,
                stdin=subprocess.DEVNULL,
            )

    def tree_pids(self, node: int) -> list[int]:
        """The agent of ``node`` first, then every process below it (empty if none)."""
        agent = self.agents.get(node)
        if agent is None or agent.poll() is not None:
            return []
        try:
            root = psutil.Process(agent.pid)
            return [root.pid, *(p.pid for p in root.children(recursive=True))]
        except psutil.NoSuchProcess:
            return []

    def kill_agent(self, node: int) -> list[int]:
        """SIGKILL ``node``'s agent and every process below it, reap the agent; return (and
        keep in ``ended``) the killed pids."""
        if node not in self.agents:
            raise ValueError(f"node {node} has no agent (nodes: {sorted(self.agents)})")
        pids = self.tree_pids(node)
        for pid in pids:
            _kill(pid)
        self.agents[node].wait()
        self.ended += pids
        return pids

    def start_agent(self, node: int) -> None:
        """A fresh agent for ``node`` (whose old one is gone): it rejoins the driver by HELLO."""
        old = self.agents.get(node)
        if old is None or old.poll() is None:
            raise ValueError(f"node {node} has no agent that is gone to replace")
        self.agents[node] = self._start_agent(node)

    def wait_exit(self, within_s: float) -> None:
        """Give every agent ``within_s`` to leave on its own (and reap it)."""
        deadline = time.monotonic() + within_s
        for agent in self.agents.values():
            try:
                agent.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                continue

    def close(self) -> None:
        """SIGKILL every process still in a node's tree; reap the agents."""
        for node, agent in self.agents.items():
            for pid in self.tree_pids(node):
                _kill(pid)
            agent.wait()

    def flood_outsider(self, flood: OutsiderFlood) -> OutsiderReport:
        """Run ``flood`` at this scenario's driver (this process) on its node port."""
        return flood.run(f"127.0.0.1:{self.config.driver_port}", os.getpid())

    def __enter__(self) -> RemoteNodes:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _kill(pid: int) -> None:
    try:
        os.kill(pid, 9)
    except ProcessLookupError:
        pass


# ---------------------------------------------------------------- an outsider on the node port

_FLOOD = ("import json, sys\nfrom chaos.surroundings import flood_node_port\n"
          "print(json.dumps(flood_node_port(*json.loads(sys.argv[1]))))\n")


@dataclasses.dataclass(frozen=True)
class OutsiderReport:
    floods: list[dict[str, Any]]  # one per mode: bytes of each frame the driver took
    growth: int  # how far the driver's resident memory rose above where it started
    violations: list[str]


@dataclasses.dataclass(frozen=True)
class OutsiderFlood:
    """A peer without the secret sends ``frames`` frames of ``frame_bytes`` per mode (each
    from its own process, never holding a frame); the driver's RSS may rise ``growth_bound``."""

    modes: tuple[str, ...] = OUTSIDER_MODES
    frames: int = 4
    frame_bytes: int = 512 << 20
    growth_bound: int = 100 << 20

    def run(self, address: str, driver_pid: int) -> OutsiderReport:
        host, port = address.rsplit(":", 1)
        with MemoryWatch(driver_pid) as watch:
            floods = [self._flood(host, int(port), mode) for mode in self.modes]
        violations = []
        if watch.growth > self.growth_bound:
            violations.append(
                f"the driver's resident memory rose {watch.growth >> 20} MiB (bound "
                f"{self.growth_bound >> 20} MiB) while a peer without the secret sent "
                f"{self.frames} x {self.frame_bytes >> 20} MiB frames ({', '.join(self.modes)}): "
                "it buffered what it should have refused")
        return OutsiderReport(floods, watch.growth, violations)

    def _flood(self, host: str, port: int, mode: str) -> dict[str, Any]:
        args = json.dumps([host, port, mode, self.frames, self.frame_bytes])
        path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
        done = subprocess.run([sys.executable, "-c", _FLOOD, args], cwd=REPO, check=True,
                              env={**os.environ, "PYTHONPATH": path}, capture_output=True,
                              timeout=60 + 15 * self.frames)
        report: dict[str, Any] = json.loads(done.stdout)
        return report


_CALL_TIMEOUT_S = 30.0
_DURING = 40  # authentic calls at most while the flood runs


def outsider_flood(ex: RecordingExecutor) -> None:
    """A workload: authentic calls (some of several wire frames) run while an outsider floods
    the driver's node port; the step returns what went wrong (expected: nothing): the flood's
    violations and any call that did not return its own value.  A large call follows."""
    ex.attempt("a peer without the secret floods the node port",
               lambda: _flood_beside_calls(ex.executor, ex.driver_address),
               check="outsider", expect_errors=frozenset({"ok"}), expect=[])
    blob = os.urandom(4 << 20)
    ex.collective_rpc("echo", args=(blob,), timeout=_CALL_TIMEOUT_S)


def _flood_beside_calls(executor: Any, address: str) -> list[str]:
    wrong: list[str] = []
    done = threading.Event()
    beside = threading.Thread(target=_calls_until, args=(executor, done, wrong),
                              name="chaos-authentic-calls")
    beside.start()  # straight to the executor: the recorder would judge two threads' order
    try:
        return OutsiderFlood().run(address, os.getpid()).violations + wrong
    finally:
        done.set()
        beside.join(2 * _CALL_TIMEOUT_S)


def _calls_until(executor: Any, done: threading.Event, wrong: list[str]) -> None:
    blob = os.urandom(512 << 10)  # two frames on the wire
    for i in range(_DURING):
        if done.is_set():
            return
        value = blob if i % 10 == 0 else i
        try:
            got = executor.collective_rpc("echo", args=(value,), timeout=_CALL_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - reported as what went wrong
            wrong.append(f"an authentic call during the flood raised {exc!r}"[:300])
            return
        if got != [value] * executor.world_size:
            wrong.append(f"authentic call {i} during the flood returned another value")
