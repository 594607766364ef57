"""Parent death: when the driver is SIGKILLed, every worker leaves, busy, idle or stopped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

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
    time.sleep(120)

if __name__ == "__main__":
    main()
"""


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.parametrize("mode", ["idle", "busy", "stopped"])
def test_workers_exit_when_the_driver_is_killed(start_method: str, mode: str) -> None:
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, start_method, "busy" if mode == "busy" else "idle"],
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
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not [p for p in pids if _alive(p)], "workers outlived their driver"
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
