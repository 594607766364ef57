"""An executor belongs to the process that created it: a fork of the caller (a child that
exits, lingers or calls) never reaches the parent's workers or queues, and a helper forked
by the driver or by a worker never hides a death."""

from __future__ import annotations

import atexit
import gc
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

import psutil
import pytest

from executor import ExecutorFailedError, ForeignProcessError, MultiprocExecutor

sys.path.insert(0, os.path.dirname(__file__))
import outsider_helpers as helpers


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    """Wait until none of ``pids`` is alive (zombies count as gone); return those left."""
    deadline = time.monotonic() + timeout
    while True:
        alive = [pid for pid in pids if _alive(pid)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.01)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _fork(body: Callable[[], None]) -> int:
    """Fork a child that runs ``body`` and then exits as a normal interpreter exit would
    (atexit handlers, including multiprocessing's and the executor's finalizer, and a
    garbage collection), without unwinding into pytest's frames."""
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            body()
            atexit._run_exitfuncs()
            gc.collect()
        except BaseException:  # noqa: BLE001 - the child must never return into pytest
            code = 1
        os._exit(code)
    return pid


@pytest.mark.parametrize("mode", ["exit", "linger", "call"])
def test_a_forked_child_never_reaches_the_parents_executor(
    make_executor: Callable[..., MultiprocExecutor], mode: str
) -> None:
    ex = make_executor()
    read_fd, write_fd = os.pipe()

    def child() -> None:
        os.close(read_fd)
        outcome = "none"
        if mode == "call":
            try:
                ex.collective_rpc("echo", args=("from-child",), timeout=5)
                outcome = "returned"
            except ForeignProcessError:
                outcome = "ForeignProcessError"
        elif mode == "linger":
            time.sleep(1.0)
        os.write(write_fd, outcome.encode())

    pid = _fork(child)
    os.close(write_fd)
    assert ex.collective_rpc("echo", args=("from-parent",), timeout=10) == ["from-parent"] * 2
    os.waitpid(pid, 0)
    with os.fdopen(read_fd) as pipe:
        assert pipe.read() == ("ForeignProcessError" if mode == "call" else "none")
    assert ex.collective_rpc("echo", args=("after",), timeout=10) == ["after"] * 2
    assert not ex.is_failed


def test_shutdown_does_not_escalate_while_a_driver_forked_helper_lives(
    make_executor: Callable[..., MultiprocExecutor], caplog: pytest.LogCaptureFixture
) -> None:
    ex = make_executor()
    pid = _fork(lambda: time.sleep(30))
    try:
        with caplog.at_level(logging.WARNING, logger="executor"):
            ex.shutdown()
        assert not [r for r in caplog.records if "SIGTERM" in r.getMessage()]
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


DRIVER_WITH_HELPER = r"""
import json, os, sys, time
from executor import ExecutorConfig, MultiprocExecutor
ex = MultiprocExecutor(ExecutorConfig(tensor_parallel_size=2, start_method=sys.argv[1]))
helper = os.fork()
if helper == 0:
    time.sleep(60)
    os._exit(0)
print(json.dumps({"workers": ex.worker_pids, "helper": helper}), flush=True)
time.sleep(60)
"""


def test_driver_sigkill_ends_workers_while_a_driver_forked_helper_lives(start_method: str) -> None:
    driver = subprocess.Popen([sys.executable, "-c", DRIVER_WITH_HELPER, start_method],
                              stdout=subprocess.PIPE, text=True)
    pids = json.loads(driver.stdout.readline())  # type: ignore[union-attr]
    try:
        driver.kill()
        driver.wait()
        assert wait_gone(pids["workers"], 10.0) == [], "workers outlived the driver"
    finally:
        for pid in [*pids["workers"], pids["helper"]]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        driver.stdout.close()  # type: ignore[union-attr]


def test_worker_death_is_seen_although_its_own_child_lingers(
    make_executor: Callable[..., MultiprocExecutor],
) -> None:
    ex = make_executor()
    grandchild = ex.collective_rpc(helpers.fork_lingering_child, args=(60,), unique_reply_rank=1)
    try:
        future = ex.collective_rpc("sleep", args=(30,), timeout=30, non_block=True)
        os.kill(ex.worker_pids[1], signal.SIGKILL)
        with pytest.raises(ExecutorFailedError, match="rank 1"):
            future.result(timeout=25)  # TimeoutError here would mean the death went unseen
    finally:
        try:
            psutil.Process(grandchild).kill()
        except psutil.NoSuchProcess:
            pass
