"""A Ray cluster on this machine: a head and worker nodes, each its own node processes on
loopback (gcs_server on the head, a raylet and object store on every node), so that killing
a node's raylet is a real node death.

    LocalRayCluster ── stdin pipe ──► keeper (python -m executor.ray_cluster KIND ...)
      (the driver)                      │ a child subreaper: every process of its node stays
                                        ▼ its descendant, whatever exits in between
                                      ray start --block [--head | --address HEAD]
                                        ├─ gcs_server, dashboard API, monitors (head only)
                                        └─ raylet ─► ray::RayWorkerActor ... (the actors)

Invariants:
- Only the driver holds the write end of each keeper's stdin.  EOF on it (``shutdown()``, or
  the driver died, even by SIGKILL) makes the keeper SIGTERM its whole tree, wait a grace,
  SIGKILL what is left and exit: no node outlives the driver.  (``ray start --block``
  ignores a SIGTERM of its own for minutes, and its children would be orphaned to init
  without the subreaper.)
- Every node's files live under one private temp dir (short: Ray's socket paths must fit
  107 bytes; worker nodes take the head's session dir), removed by ``shutdown()`` or, when
  the driver died, by the head's keeper once its tree is down.  The plasma store is an
  unlinked file in /dev/shm that goes with its raylet.
- Node ``k`` carries the custom resource ``faultlab_node_k``: that is its name in errors
  (on loopback every node has the same IP).  Node 0 is the head.
- The driver must set ``RAY_ENV`` before it imports ray (``apply_ray_env``): ray reads some
  of it at import time.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

import psutil

# Loopback multi-node (the flag name is Ray's: it also unlocks multi-node on Linux with a
# 127.0.0.1 node address), no usage stats, no token files, no implicit ray.init; and node-death detection in
# about a second: the GCS health-checks each raylet every 300 ms and gives up after 3 misses.
RAY_ENV = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_AUTH_MODE": "disabled",
    "RAY_ENABLE_AUTO_CONNECT": "0",  # a ray call after disconnecting must fail, not start a Ray
    "RAY_health_check_initial_delay_ms": "0",
    "RAY_health_check_period_ms": "300",
    "RAY_health_check_timeout_ms": "1000",
    "RAY_health_check_failure_threshold": "3",
}
NODE_RESOURCE = "faultlab_node_{}"
OBJECT_STORE_BYTES = 80 * 1024 * 1024
KEEPER_GRACE_S = 3.0  # SIGTERM to SIGKILL, inside the keeper
_PR_SET_PDEATHSIG, _PR_SET_CHILD_SUBREAPER = 1, 36


def apply_ray_env() -> None:
    """Put ``RAY_ENV`` into this process's environment (the user's values win)."""
    for key, value in RAY_ENV.items():
        os.environ.setdefault(key, value)


class RayNode:
    """One node of the cluster: its keeper process and the processes under it."""

    def __init__(self, index: int, keeper: subprocess.Popen[bytes]) -> None:
        self.index = index
        self.name = f"node{index}"
        self.keeper = keeper

    def processes(self) -> list[psutil.Process]:
        try:
            return list(psutil.Process(self.keeper.pid).children(recursive=True))
        except psutil.NoSuchProcess:
            return []

    def raylet(self) -> psutil.Process | None:
        return next((p for p in self.processes() if _RAYLET in _cmd(p).split(' ', 1)[0]), None)

    def signal_all(self, sig: int) -> list[int]:
        """Send ``sig`` to every process of the node (SIGSTOP freezes the node); their pids."""
        sent = []
        for proc in self.processes():
            try:
                proc.send_signal(sig)
                sent.append(proc.pid)
            except psutil.NoSuchProcess:
                pass
        return sent


_RAYLET = "ray/raylet/raylet"  # in the raylet's binary path, which starts its command line


class LocalRayCluster:
    """``nodes`` Ray nodes on loopback with ``cpus`` CPUs each; ``address`` is the head's."""

    def __init__(self, nodes: int = 2, cpus: int = 2, *, start_timeout: float = 180.0,
                 object_store_bytes: int = OBJECT_STORE_BYTES) -> None:
        if not isinstance(nodes, int) or nodes < 1:
            raise ValueError(f"nodes must be an integer >= 1, got {nodes!r}")
        if not isinstance(cpus, int) or cpus < 1:
            raise ValueError(f"cpus must be an integer >= 1, got {cpus!r}")
        self.temp_dir = tempfile.mkdtemp(prefix="flr-", dir="/tmp")
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.nodes: list[RayNode] = []
        self._cpus, self._store = cpus, object_store_bytes
        started = time.monotonic()
        try:
            for index in range(nodes):
                self._start_node(index, started + start_timeout)
        except BaseException:
            self.shutdown()
            raise
        self.startup_s = time.monotonic() - started

    def _start_node(self, index: int, deadline: float) -> None:
        """Start node ``index``; Ray gives a node 30 s to register, so a loaded machine may
        need a second try."""
        while True:
            node = RayNode(index, self._spawn_keeper(index))
            self.nodes.append(node)
            if self._wait_registered(node, deadline):
                return
            self._stop_node(node)
            self.nodes.remove(node)
            if time.monotonic() > deadline:
                raise TimeoutError(f"ray node {index} did not start within its deadline; "
                                   f"see the logs under {self.temp_dir}")

    def _spawn_keeper(self, index: int) -> subprocess.Popen[bytes]:
        args = ["--num-cpus", str(self._cpus), "--node-ip-address", "127.0.0.1",
                "--object-store-memory", str(self._store), "--disable-usage-stats",
                "--resources", json.dumps({NODE_RESOURCE.format(index): 1})]
        if index == 0:
            args += ["--head", "--port", str(self.port), "--include-dashboard", "false",
                     "--temp-dir", self.temp_dir]
        else:
            args += ["--address", self.address]
        env = {**os.environ, **RAY_ENV}
        log = open(os.path.join(self.temp_dir, f"node{index}.log"), "ab")  # noqa: SIM115
        try:
            return subprocess.Popen(
                [sys.executable, "-m", "executor.ray_cluster", *args], stdin=subprocess.PIPE,
                stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
            )
        finally:
            log.close()

    def _wait_registered(self, node: RayNode, deadline: float) -> bool:
        """True once the node's raylet is up and its resource is known to the head."""
        while time.monotonic() < deadline:
            if node.keeper.poll() is not None:
                return False
            if self._registered(node.index):
                return True
            time.sleep(0.3)
        return False

    def _registered(self, index: int) -> bool:
        """``ray start`` says so once its node registered with the GCS."""
        return _has_line(os.path.join(self.temp_dir, f"node{index}.log"), "Ray runtime started")

    def node(self, name_or_index: str | int) -> RayNode:
        for node in self.nodes:
            if name_or_index in (node.index, node.name):
                return node
        raise KeyError(f"no node {name_or_index!r} in this cluster")

    def kill_raylet(self, node: str | int) -> int:
        """SIGKILL node's raylet (a node death); its pid."""
        raylet = self.node(node).raylet()
        if raylet is None:
            raise RuntimeError(f"node {node!r} has no raylet (already dead?)")
        raylet.kill()
        return int(raylet.pid)

    def restart_node(self, node: str | int, timeout: float = 180.0) -> RayNode:
        """Take what is left of a worker node down and start a fresh one in its place (a
        new raylet and node id, the same name)."""
        old = self.node(node)
        if old.index == 0:
            raise ValueError("the head cannot be restarted: start a new cluster")
        self._stop_node(old)
        self.nodes.remove(old)
        _truncate(os.path.join(self.temp_dir, f"node{old.index}.log"))
        self._start_node(old.index, time.monotonic() + timeout)
        self.nodes.sort(key=lambda n: n.index)
        return self.node(old.index)

    def pids(self) -> list[int]:
        return [p.pid for n in self.nodes for p in [psutil.Process(n.keeper.pid), *n.processes()]
                if p.is_running()]

    def shutdown(self) -> None:
        """Stop every node (worker nodes first, the head last) and remove the temp dir."""
        for node in reversed(self.nodes):
            self._stop_node(node)
        self.nodes = []
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    @staticmethod
    def _stop_node(node: RayNode) -> None:
        if node.keeper.stdin is not None:
            node.keeper.stdin.close()  # EOF: the keeper takes its tree down
        try:
            node.keeper.wait(KEEPER_GRACE_S + 10)
        except subprocess.TimeoutExpired:
            for proc in node.processes():
                _kill_quietly(proc)
            node.keeper.kill()
            node.keeper.wait()

    def __enter__(self) -> LocalRayCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def _has_line(path: str, text: str) -> bool:
    try:
        with open(path, errors="replace") as f:
            return text in f.read()
    except FileNotFoundError:
        return False


def _truncate(path: str) -> None:
    with open(path, "wb"):
        pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cmd(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline())
    except psutil.Error:
        return ""


def _kill_quietly(proc: psutil.Process) -> None:
    try:
        proc.kill()
    except psutil.NoSuchProcess:
        pass


# ---------------------------------------------------------------------- the keeper process

class _Stop(Exception):
    """SIGTERM reached the keeper (its driver died, or someone asked)."""


def _stop(*_: object) -> None:
    raise _Stop


def keep(ray_start_args: Sequence[str]) -> int:
    """Run ``ray start --block ARGS`` until stdin reaches EOF, then take its tree down."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)  # the driver's thread: EOF too
    signal.signal(signal.SIGTERM, _stop)  # ends the read below; we then clean up
    ray = os.path.join(os.path.dirname(sys.executable), "ray")
    child = subprocess.Popen([ray, "start", "--block", *ray_start_args], stdin=subprocess.DEVNULL)
    try:
        while os.read(0, 4096):
            pass
    except (OSError, _Stop):
        pass
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _take_down(psutil.Process(), child)
    if "--head" in ray_start_args and "--temp-dir" in ray_start_args:  # the driver may be gone
        shutil.rmtree(ray_start_args[ray_start_args.index("--temp-dir") + 1], ignore_errors=True)
    return 0


def _take_down(me: psutil.Process, child: subprocess.Popen[bytes]) -> None:
    tree = me.children(recursive=True)
    for proc in tree:
        try:
            proc.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(tree, timeout=KEEPER_GRACE_S)
    for proc in alive:
        _kill_quietly(proc)
    psutil.wait_procs(alive, timeout=5)
    child.poll()
    while True:  # reap every orphan that was reparented to us
        try:
            if os.waitpid(-1, os.WNOHANG) == (0, 0):
                break
        except ChildProcessError:
            break


if __name__ == "__main__":
    sys.exit(keep(sys.argv[1:]))
