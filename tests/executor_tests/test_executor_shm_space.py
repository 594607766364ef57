"""Shared memory that never leaks a name and never SIGBUSes: rings are anonymous and allocated up front.

    driver subprocess (SlowStartWorker) ── SIGKILL at 0 / 50 / 200 ms ──► no process, no /dev/shm name
    private mount namespace, 20 MB tmpfs on /dev/shm ──► a TP=2 executor echoes 8 MiB
    more memory than there is ──► SharedMemoryError from the constructor, nothing left behind

Processes of a killed driver are found by a unique environment tag every one of them
inherits (the forkserver and its children included), since orphans are re-parented away
from the test.
"""

from __future__ import annotations

import functools
import json
import os
import pickle
import re
import secrets
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from executor import MultiprocExecutor, SharedMemoryError

ROOT = Path(__file__).resolve().parents[2]
HELPERS = Path(__file__).resolve().parent
TAG = "FAULTLAB_SHM_TEST_TAG"
_OWNER_RE = re.compile(r"^faultlab_(\d+)_")

SLOW_DRIVER = r"""
import sys
from executor import ExecutorConfig, MultiprocExecutor

if __name__ == "__main__":
    print("go", flush=True)
    MultiprocExecutor(ExecutorConfig(
        tensor_parallel_size=2, start_method=sys.argv[1], worker="exec_helpers:SlowStartWorker",
        worker_kwargs={"delay": 60}, startup_timeout=120,
    ))
"""

# Runs inside a private mount namespace whose /dev/shm is a small tmpfs; prints one JSON line.
SMALL_SHM_CHILD = r"""
import json, os, sys
from executor import ExecutorConfig, MultiprocExecutor, SharedMemoryError, shm

def fds():
    from multiprocessing import forkserver, resource_tracker
    helpers = {forkserver._forkserver._forkserver_alive_fd, resource_tracker._resource_tracker._fd}
    return sorted(fd for fd in os.listdir("/proc/self/fd") if int(fd) not in helpers)

if __name__ == "__main__":
    start_method, named, chunk_bytes = sys.argv[1], sys.argv[2] == "named", int(sys.argv[3])
    shm.MEMFD = not named
    out = {}
    before = fds()
    try:
        ex = MultiprocExecutor(ExecutorConfig(
            tensor_parallel_size=2, start_method=start_method, chunk_bytes=chunk_bytes))
    except SharedMemoryError as exc:
        out["error"] = str(exc)
    else:
        payload = os.urandom(8 << 20)
        out["echoed"] = ex.collective_rpc("echo", args=(payload,), timeout=60) == [payload] * 2
        out["shm_while_running"] = os.listdir("/dev/shm")
        ex.shutdown()
    import multiprocessing
    out["children"] = [p.pid for p in multiprocessing.active_children()]
    out["leaked_fds"] = sorted(set(fds()) - set(before))
    out["shm_after"] = os.listdir("/dev/shm")
    print(json.dumps(out), flush=True)
"""


def _env(**extra: str) -> dict[str, str]:
    path = os.pathsep.join([str(ROOT), str(HELPERS), os.environ.get("PYTHONPATH", "")])
    return dict(os.environ, PYTHONPATH=path, **extra)


def _tagged(tag: str) -> list[psutil.Process]:
    """Live processes whose environment carries ``tag`` (every descendant of the driver)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(TAG) == tag and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def _wait_gone(tag: str, within_s: float) -> list[psutil.Process]:
    deadline = time.monotonic() + within_s
    while (left := _tagged(tag)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def _owned_by(names: set[str], pids: set[int]) -> list[str]:
    return sorted(n for n in names if (m := _OWNER_RE.match(n)) and int(m.group(1)) in pids)


@pytest.mark.parametrize("delay_ms", [0, 50, 200])
def test_driver_killed_during_start_up_leaves_nothing(start_method: str, delay_ms: int) -> None:
    tag = secrets.token_hex(8)
    shm_before = set(os.listdir("/dev/shm"))
    driver = subprocess.Popen(
        [sys.executable, "-c", SLOW_DRIVER, start_method], stdout=subprocess.PIPE, text=True,
        env=_env(**{TAG: tag}), cwd=ROOT,
    )
    seen: set[int] = {driver.pid}
    try:
        assert driver.stdout is not None and driver.stdout.readline().strip() == "go"
        time.sleep(delay_ms / 1000)
        seen |= {p.pid for p in _tagged(tag)}
        driver.kill()
        driver.wait(10)
        left = _wait_gone(tag, 10.0)
    finally:
        driver.kill()
        driver.wait()
        driver.stdout.close()  # type: ignore[union-attr]
        for proc in _tagged(tag):
            proc.kill()  # never leave an orphan behind, even when the test fails
    assert not left, f"processes {[(p.pid, p.name()) for p in left]} outlived the killed driver"
    leaked = _owned_by(set(os.listdir("/dev/shm")) - shm_before, seen)
    assert not leaked, f"/dev/shm segments {leaked} outlived the driver killed after {delay_ms} ms"


@functools.cache
def _unshare_refusal() -> str:
    """Why a private mount namespace with its own /dev/shm cannot be had here ('' if it can)."""
    try:
        probe = subprocess.run(
            ["unshare", "-m", "--propagation", "private", "sh", "-c",
             "mount -t tmpfs -o size=1m none /dev/shm"],
            capture_output=True, text=True, timeout=30,
        )
    except FileNotFoundError:
        return "unshare(1) is not installed"
    if probe.returncode != 0:
        return f"no private mount namespace with a tmpfs /dev/shm: {probe.stderr.strip()}"
    return ""


def _in_small_shm(start_method: str, mode: str, chunk_bytes: int = 1 << 20) -> dict:
    refusal = _unshare_refusal()
    if refusal:
        pytest.skip(refusal)
    done = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c",
         'mount -t tmpfs -o size=20m none /dev/shm && exec "$@"', "sh",
         sys.executable, "-c", SMALL_SHM_CHILD, start_method, mode, str(chunk_bytes)],
        capture_output=True, text=True, timeout=180, env=_env(), cwd=ROOT,
    )
    assert done.returncode == 0, f"exit {done.returncode}:\n{done.stderr[-3000:]}"
    lines = done.stdout.strip().splitlines()
    assert lines, done.stderr[-3000:]
    result: dict = json.loads(lines[-1])
    assert result["children"] == [] and result["leaked_fds"] == [], result
    assert result["shm_after"] == [], result
    return result


def test_an_8_mib_echo_fits_a_20_mb_dev_shm(start_method: str) -> None:
    """Three 8 MiB rings would not fit in 20 MB of /dev/shm: memfd memory does not live there."""
    result = _in_small_shm(start_method, "memfd")
    assert result.get("echoed") is True, result
    assert result["shm_while_running"] == [], result


def test_named_fallback_echoes_and_names_nothing_while_running(start_method: str) -> None:
    result = _in_small_shm(start_method, "named", chunk_bytes=256 << 10)  # 3 rings of 2 MiB
    assert result.get("echoed") is True, result
    assert result["shm_while_running"] == [], result


def test_named_fallback_out_of_room_is_a_clear_error(start_method: str) -> None:
    """rpc and reply0 (8 MiB each) fit in 20 MB, reply1 does not: fallocate fails for real."""
    result = _in_small_shm(start_method, "named")
    error = result.get("error", "")
    assert "queue reply1" in error and "free in /dev/shm" in error, result
    needed, free = (int(n) for n in re.findall(r"(\d+) bytes", error)[:2])
    assert needed > 8 << 20 and 0 <= free < needed, error


def _fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_more_memory_than_there_is_fails_in_the_constructor(
    make_executor: Callable[..., MultiprocExecutor],
) -> None:
    fds_before = _fds()
    with pytest.raises(SharedMemoryError) as caught:
        make_executor(chunk_bytes=1 << 40)  # 8 chunks of 1 TiB
    message = str(caught.value)
    assert "queue rpc" in message and "of memory available" in message, message
    assert "n_chunks or chunk_bytes" in message, message
    needed = int(re.findall(r"(\d+) bytes", message)[0])
    assert needed > 8 << 40, message
    assert _fds() - fds_before == set(), "the failed constructor left file descriptors open"


def test_a_segment_fd_only_travels_to_a_process_being_started() -> None:
    """Pickled anywhere else, DupFd would start a resource-sharer thread and leak the fd to it."""
    from executor import shm

    segment = shm.ShmSegment.create("stray", 4096)
    try:
        with pytest.raises(RuntimeError, match="inheritance"):
            pickle.dumps(segment.handle())
    finally:
        segment.close()


AS_LIMITED_DRIVER = r"""
import resource, sys
from executor import ExecutorConfig, MultiprocExecutor, SharedMemoryError

resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
cfg = ExecutorConfig(worker="executor.workers:EchoWorker", tensor_parallel_size=2,
                     n_chunks=4, chunk_bytes=128 << 20)  # 3 rings of 512 MiB
try:
    MultiprocExecutor(cfg).shutdown()
except SharedMemoryError as exc:
    print("SharedMemoryError:", exc)
except BaseException as exc:
    print("other:", type(exc).__name__, exc)
"""


def test_ring_mmap_refused_by_the_address_space_limit_is_a_shared_memory_error() -> None:
    """RLIMIT_AS=1 GiB and 3 rings of 512 MiB: fallocate succeeds, mmap fails (ENOMEM)."""
    out = subprocess.run([sys.executable, "-c", AS_LIMITED_DRIVER], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert out.stdout.startswith("SharedMemoryError:"), (out.stdout, out.stderr[-2000:])
    assert "queue reply" in out.stdout and "address space" in out.stdout, out.stdout
    needed = int(re.findall(r"(\d+) bytes", out.stdout)[0])
    assert needed > 512 << 20, out.stdout
