"""The peer targets' drivers (loky, pebble, ray), run directly: what each executor does.

Each test starts a driver as the observer would (its target's ``launch``, a session of its
own, a private TMPDIR), reads its events with ``protocol.parse`` and, at the end, kills
whatever is left of the run by marker and session, so nothing outlives the test (Ray's
agents outlive a killed driver by a minute or more).

The tables say what each executor is known to do; they were observed, not wished for.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from chaos.targets import base, peer_workload, protocol
from chaos.targets.protocol import call_value

PEERS = (
    pytest.param("loky", id="loky"),
    pytest.param("pebble", id="pebble"),
    pytest.param("ray", id="ray", marks=pytest.mark.slow),  # ray.init: ~5-8 s here
)
EVENT_WAIT_S = 60.0  # Ray's start-up on two shared cores, with room to spare

# Worker rank 1 SIGKILLed in the middle of call 1 of 4: the failed call's exception type, a
# pattern its message matches, and what the calls after it do.
#   loky: the reusable executor is broken; the next get_reusable_executor starts a new one.
#   pebble: the pool replaces the worker; only the task it held fails.
#   ray: the actor is dead (max_restarts=0): every later call on it fails the same way.
ON_WORKER_KILL = {
    "loky": ("TerminatedWorkerError", r"exit codes of the workers are \{SIGKILL\(-9\)\}", "ok"),
    "pebble": ("ProcessExpired", r"^Abnormal termination$", "ok"),
    "ray": ("ActorDiedError", r"pid: {pid}\b.*worker process has died", "fail"),
}
# Helper roles each driver names in its ready tree (besides driver and workers).
HELPER_ROLES = {
    "loky": {"loky_resource_tracker"},
    "pebble": set(),
    "ray": {"ray_gcs", "ray_raylet", "ray_dashboard_agent", "ray_runtime_env_agent"},
}
LOOPBACK = ("127.0.0.1", "::1", "::ffff:127.0.0.1")
# The names a run creates in /dev/shm, by driver pid (loky's semaphores; the others, none).
SHM_PREFIXES = {"loky": "sem.loky-{pid}-"}


def segments_of(name: str, driver_pid: int) -> list[str]:
    prefix = SHM_PREFIXES.get(name)
    if prefix is None:
        return []
    prefix = prefix.format(pid=driver_pid)
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith(prefix))


class DriverRun:
    """One driver subprocess and its events, as the observer sees them."""

    def __init__(self, name: str, spec: base.WorkloadSpec, out_dir: Path, tmp_dir: str) -> None:
        self.name = name
        launch = base.get_target(name).launch(spec, str(out_dir))
        expected = base.get_target(name).expected_values(spec)
        assert expected is not None
        self.expected = expected
        self.marker = launch.env[peer_workload.MARKER_ENV]
        self.events: list[dict[str, Any]] = []
        self._ended = False  # the driver's stdout reached its end
        self._changed = threading.Condition()
        self._stderr_path = out_dir / "driver.stderr"
        self._stderr = open(self._stderr_path, "w")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            launch.argv, env={**launch.env, "TMPDIR": tmp_dir}, cwd=launch.cwd,
            stdout=subprocess.PIPE, stderr=self._stderr, text=True, start_new_session=True)
        self._reader = threading.Thread(target=self._read, name="peer-driver-reader", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            event = protocol.parse(line)
            if event is not None:
                with self._changed:
                    self.events.append(event)
                    self._changed.notify_all()
        with self._changed:
            self._ended = True
            self._changed.notify_all()

    def wait_for(self, match: Callable[[dict[str, Any]], bool],
                 timeout: float = EVENT_WAIT_S) -> dict[str, Any]:
        def first() -> dict[str, Any] | None:
            return next((e for e in self.events if match(e)), None)

        with self._changed:
            self._changed.wait_for(lambda: first() is not None or self._ended, timeout)
            found = first()
        if found is None:
            ending = "the driver's output ended" if self._ended else f"nothing within {timeout}s"
            stderr = self._stderr_path.read_text()[-1500:]
            pytest.fail(f"no such event: {ending}; saw {[e['ev'] for e in self.events]}; "
                        f"driver stderr ends:\n{stderr}")
        return found

    def ready(self) -> dict[str, Any]:
        return self.wait_for(lambda e: e["ev"] == "ready")

    def pid_of(self, role: str, rank: int | None = None) -> int:
        return next(p["pid"] for p in self.ready()["procs"] if p["role"] == role and p["rank"] == rank)

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["ev"] == kind]

    def close(self) -> None:
        """Kill the driver and every process of its run (after a moment in which a driver
        that ended by itself lets its helpers clean up: loky's resource tracker unlinks the
        semaphores of a broken executor only then), remove named segments the run left,
        wait for the reader to end."""
        if self.proc.poll() is None:
            self.proc.kill()
        else:
            alive_after([p.pid for p in peer_workload.marked_processes(self.marker, self.proc.pid)], 5.0)
        self.proc.wait(timeout=10)
        peer_workload.kill_marked(self.marker, session=self.proc.pid)
        for name in segments_of(self.name, self.proc.pid):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join("/dev/shm", name))
        self._reader.join(timeout=10)
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        self._stderr.close()


@pytest.fixture
def run_driver(tmp_path: Path) -> Iterator[Callable[..., DriverRun]]:
    runs: list[DriverRun] = []
    tmp_dir = tempfile.mkdtemp(prefix="flp-")  # short: Ray's socket paths must fit 107 bytes

    def start(name: str, **fields: Any) -> DriverRun:
        run = DriverRun(name, base.WorkloadSpec(**fields), tmp_path, tmp_dir)
        runs.append(run)
        return run

    yield start
    for run in runs:
        run.close()
    shutil.rmtree(tmp_dir, ignore_errors=True)


def alive(pids: list[int]) -> list[int]:
    living = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                living.append(pid)
    return living


def alive_after(pids: list[int], wait_s: float) -> list[int]:
    """Those of ``pids`` still alive once ``wait_s`` has passed (or all are gone earlier)."""
    deadline = time.monotonic() + wait_s
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive(pids)


def listening_beyond_loopback(pids: list[int]) -> list[str]:
    found = []
    for pid in alive(pids):
        with contextlib.suppress(psutil.Error):
            for conn in psutil.Process(pid).net_connections(kind="inet"):
                if conn.status == psutil.CONN_LISTEN and conn.laddr.ip not in LOOPBACK:
                    found.append(f"pid {pid} listens on {conn.laddr.ip}:{conn.laddr.port}")
    return found


@pytest.mark.parametrize("name", PEERS)
def test_target_module_declares_itself(name: str, tmp_path: Path) -> None:
    target = base.get_target(name)
    assert (target.name, target.extra) == (name, "targets")
    assert target.unavailable() is None
    assert target.applies <= set(base.FAULT_KINDS) and "kill" in target.applies
    spec = base.WorkloadSpec(calls=3, ranks=4, linger_s=1.5)
    launch = target.launch(spec, str(tmp_path))
    assert launch.argv[:3] == [sys.executable, "-m", f"chaos.targets.{name}_driver"]
    assert peer_workload.load_spec(launch.argv[2:]) == spec
    assert launch.env[peer_workload.MARKER_ENV].startswith(f"{name}-")
    assert launch.env["PATH"] == os.environ["PATH"], "the observer runs it with this env as is"
    assert target.expected_values(spec) == {i: [call_value(i, r) for r in range(4)] for i in range(3)}


@pytest.mark.parametrize("name", PEERS)
def test_fault_free_run_gives_every_call_its_value(name: str, run_driver: Callable[..., DriverRun]) -> None:
    run = run_driver(name, calls=3, call_s=0.1, ranks=2)
    ready = run.ready()
    roles = [(p["role"], p["rank"]) for p in ready["procs"]]
    assert roles[:3] == [("driver", None), ("worker", 0), ("worker", 1)]
    assert HELPER_ROLES[name] <= {role for role, _ in roles}
    pids = [p["pid"] for p in ready["procs"]]
    assert len(set(pids)) == len(pids) and ready["procs"][0]["pid"] == run.proc.pid
    assert listening_beyond_loopback(pids) == []
    run.wait_for(lambda e: e["ev"] == "done")
    assert run.proc.wait(timeout=30) == 0
    assert {e["id"]: e["value"] for e in run.of("ok")} == run.expected
    assert run.of("fail") == [] and run.of("error") == []
    # loky's resource trackers leave a moment after their driver, once their pipe closes.
    assert alive_after(pids[1:], 3.0) == [], "a clean end leaves none of the executor's processes"
    assert segments_of(name, run.proc.pid) == []


@pytest.mark.parametrize("name", PEERS)
def test_sigkill_of_worker_rank_1_mid_call(name: str, run_driver: Callable[..., DriverRun]) -> None:
    error_type, pattern, after = ON_WORKER_KILL[name]
    run = run_driver(name, calls=4, call_s=0.5, ranks=2)
    victim = run.pid_of("worker", 1)
    run.wait_for(lambda e: e["ev"] == "invoke" and e["id"] == 1)
    time.sleep(0.15)
    killed_ns = time.time_ns()
    os.kill(victim, signal.SIGKILL)
    run.wait_for(lambda e: e["ev"] == "done")

    assert [e["id"] for e in run.of("ok")][:1] == [0]
    failed = next(e for e in run.of("fail") if e["id"] == 1)
    assert failed["type"] == error_type
    assert re.search(pattern.replace("{pid}", str(victim)), failed["message"], re.S), failed["message"]
    [error] = run.of("error")
    assert (error["type"], error["message"]) == (failed["type"], failed["message"])
    assert 0 < (error["t"] - killed_ns) / 1e9 < 5.0, "the caller hears of the death promptly"
    later = {e["id"]: e for e in run.events if e["ev"] in ("ok", "fail") and e["id"] >= 2}
    assert sorted(later) == [2, 3] and {e["ev"] for e in later.values()} == {after}
    if after == "ok":
        assert [later[i]["value"] for i in (2, 3)] == [run.expected[2], run.expected[3]]
    # The driver lives through it and ends cleanly: its executor's processes go and take
    # their segments with them (loky's tracker unlinks the broken executor's semaphores).
    assert run.proc.wait(timeout=30) == 0
    tree = [p["pid"] for p in run.ready()["procs"][1:]]
    assert alive_after(tree, 5.0) == [] and segments_of(name, run.proc.pid) == []


def test_driver_lingers_after_done(run_driver: Callable[..., DriverRun]) -> None:
    run = run_driver("pebble", calls=1, call_s=0.05, ranks=1, linger_s=1.0)
    done = run.wait_for(lambda e: e["ev"] == "done")
    time.sleep(max(0.0, done["t"] / 1e9 + 0.6 - time.time()))
    assert run.proc.poll() is None, "the driver is still there in its idle window"
    assert run.proc.wait(timeout=10) == 0
