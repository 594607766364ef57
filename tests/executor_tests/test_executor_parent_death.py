"""Parent death: when the driver is SIGKILLed, every worker leaves, busy, idle or stopped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

import psutil
import pytest

DRIVER = r"""
import json, sys, time
from executor import ExecutorConfig, MultiprocExecutor

def main():
    start_method, mode = sys.argv[1], sys.argv[2]
    ex = MultiprocExecutor(ExecutorConfig(tensor_parallel_size=2, start_method=start_method))
    print(json.dumps(ex.worker_pids), flush=True)
    if mode == "busy":
        ex.collective_rpc("sleep", args=(120,))
    if mode == "gil_c_code":  # C code that never gives up the GIL
        ex.collective_rpc(lambda w: sum(range(10**12)), non_block=True)
    if mode == "regex":  # catastrophic backtracking: also one C call holding the GIL
        ex.collective_rpc(lambda w: __import__("re").match(r"(a+)+$", "a" * 64 + "b"), non_block=True)
    time.sleep(120)

if __name__ == "__main__":
    main()
"""


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


GONE_BOUND_S = 2.0  # the promise is 200 ms; the bound leaves room for a loaded machine


@pytest.mark.parametrize("mode", ["idle", "busy", "stopped", "gil_c_code", "regex"])
def test_workers_exit_when_the_driver_is_killed(start_method: str, mode: str) -> None:
    """Whatever a worker's main thread does, even C code that holds the GIL (the exit guard)."""
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, start_method, "idle" if mode == "stopped" else mode],
        stdout=subprocess.PIPE, text=True, cwd=os.getcwd(),
    )
    try:
        pids = json.loads(driver.stdout.readline())  # type: ignore[union-attr]
        assert len(pids) == 2
        time.sleep(0.3)  # let a busy worker enter its method
        if mode == "stopped":
            os.kill(pids[1], signal.SIGSTOP)
        driver.kill()
        driver.wait(10)
        deadline = time.monotonic() + GONE_BOUND_S
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.005)
        assert not [p for p in pids if _alive(p)], f"workers outlived their driver by {GONE_BOUND_S} s"
        assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"faultlab_{driver.pid}_")]
    finally:
        driver.kill()
        driver.wait()
        driver.stdout.close()  # type: ignore[union-attr]
        for pid in pids if "pids" in locals() else []:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_workers_exit_when_the_driver_exits_without_shutdown(start_method: str) -> None:
    script = (
        "from executor import ExecutorConfig, MultiprocExecutor\n"
        "import json, sys\n"
        "if __name__ == '__main__':\n"
        f"    ex = MultiprocExecutor(ExecutorConfig(tensor_parallel_size=2, start_method={start_method!r}))\n"
        "    print(json.dumps(ex.worker_pids), flush=True)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    pids = json.loads(done.stdout)
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not [p for p in pids if _alive(p)]
    assert "leaked" not in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_each_worker_has_one_exit_guard_and_it_goes_with_its_worker(executor: Any) -> None:
    guards = {}
    for pid in executor.worker_pids:
        kids = psutil.Process(pid).children()
        assert [k.name() for k in kids] == ["faultlab-guard"], kids
        guards[pid] = kids[0].pid
    victim = executor.worker_pids[1]
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + GONE_BOUND_S
    while _alive(guards[victim]) and time.monotonic() < deadline:
        time.sleep(0.005)
    assert not _alive(guards[victim]), "the guard outlived its worker"
