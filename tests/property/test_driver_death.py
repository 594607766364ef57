"""Parent death, for any plan: SIGKILL the driver, and every worker exits, nothing leaks.

    this test ── spawn ──► driver_child.py (executor + drawn calls) ── "kill-me" ──► SIGKILL
        then: every process under the driver gone within EXIT_S (a SIGSTOPped worker too),
              no /dev/shm/faultlab_<driver pid>_* left

Drawn: the start method, a call sequence (chaos.strategies.call_sequences), the phase the
kill lands in (idle, futures pending, driver blocked in a call, workers busy, start-up),
and optionally a worker SIGSTOPped just before the kill.
"""

from __future__ import annotations

import dataclasses
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
from hypothesis import given
from hypothesis import strategies as st
from hypothesis_profiles import scaled

from chaos.strategies import call_sequences
from chaos.workloads import CallSpec

EXIT_S = 5.0  # workers must be gone this long after the driver's SIGKILL (generous: loaded machine)
START_S = 60.0
CHILD = Path(__file__).with_name("driver_child.py")
ROOT = Path(__file__).resolve().parents[2]


@dataclasses.dataclass(frozen=True)
class DriverDeath:
    start_method: str
    calls: list[CallSpec]
    phase: str
    stop_rank: int | None  # a worker SIGSTOPped just before the kill, or None
    delay_s: float  # from "kill-me" to the SIGKILL (start-up: somewhere inside it)


driver_deaths = st.builds(
    DriverDeath,
    st.sampled_from(["fork", "forkserver", "spawn"]),
    call_sequences(2, max_calls=4),
    st.sampled_from(["idle", "pending", "blocking", "busy", "startup"]),
    st.one_of(st.none(), st.integers(0, 1)),
    st.sampled_from([0.0, 0.02, 0.2]),
)


@scaled(0.12, minimum=6)
@given(plan=driver_deaths)
def test_workers_exit_when_the_driver_is_killed(plan: DriverDeath) -> None:
    child = _start_driver(plan)
    try:
        pids = _wait_for_kill_point(child, plan)
        doomed = _descendants(child.pid) | set(pids)
        if plan.stop_rank is not None and pids:
            os.kill(pids[plan.stop_rank], signal.SIGSTOP)
        child.send_signal(signal.SIGKILL)
        child.wait()
    finally:
        _end(child)
    left = _still_alive(doomed, EXIT_S)
    for pid in left:
        _kill(pid)  # never leave an orphan behind, even when the property fails
    assert not left, f"{plan}: processes {left} outlived the SIGKILLed driver by {EXIT_S:g} s"
    leaked = _segments_of(child.pid)  # rings are anonymous memory: even mid-start-up, none
    assert not leaked, f"{plan}: /dev/shm segments {leaked} outlived the driver"


def _start_driver(plan: DriverDeath) -> subprocess.Popen[bytes]:
    spec = {"start_method": plan.start_method, "phase": plan.phase,
            "calls": [dataclasses.asdict(c) for c in plan.calls]}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return subprocess.Popen([sys.executable, str(CHILD), json.dumps(spec)], stdout=subprocess.PIPE,
                            env=env, cwd=ROOT)


def _wait_for_kill_point(child: subprocess.Popen[bytes], plan: DriverDeath) -> list[int]:
    pids: list[int] = []
    for line in _lines(child, START_S):
        if line.startswith("started"):
            pids = json.loads(line.split(" ", 1)[1])
        elif line == "kill-me":
            time.sleep(plan.delay_s if plan.phase == "startup" else max(plan.delay_s, 0.05))
            return pids
    raise AssertionError(f"{plan}: the driver exited ({child.poll()}) or hung before its kill point")


def _lines(child: subprocess.Popen[bytes], within_s: float) -> Iterator[str]:
    """The child's stdout lines as they come (raw reads: no buffer hides a line from select)."""
    assert child.stdout is not None
    fd, buf = child.stdout.fileno(), b""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        chunk = os.read(fd, 4096) if ready else b""
        if ready and not chunk:
            return  # EOF: the child exited
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            yield line.decode().strip()


def _descendants(pid: int) -> set[int]:
    try:
        return {p.pid for p in psutil.Process(pid).children(recursive=True)}
    except psutil.NoSuchProcess:
        return set()


def _still_alive(pids: set[int], within_s: float) -> list[int]:
    deadline = time.monotonic() + within_s
    while True:
        left = sorted(p for p in pids if _alive(p))
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.02)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.NoSuchProcess:
        return False


def _segments_of(pid: int) -> list[str]:
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith(f"faultlab_{pid}_"))


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _end(child: subprocess.Popen[bytes]) -> None:
    if child.poll() is None:
        child.kill()
        child.wait()
    if child.stdout is not None:
        child.stdout.close()
