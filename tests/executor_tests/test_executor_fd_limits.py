"""Many file descriptors: a driver that already holds 1,100 fds, and more workers than the
open-files limit fits.

    1,100 fds opened first ──► every fd the executor opens is past 1,024 (and, under fork,
                                every worker's too) ──► calls wait in poll, never select
    RLIMIT_NOFILE too low for TP ──► raised to the hard limit when that fits, else
                                     ResourceLimitError before any worker starts
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from executor import MultiprocExecutor

ROOT = Path(__file__).resolve().parents[2]
HELD_FDS = 1100


@pytest.fixture
def many_fds() -> Iterator[list[int]]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < HELD_FDS + 512:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    fds = [os.open(os.devnull, os.O_RDONLY) for _ in range(HELD_FDS)]
    try:
        yield fds
    finally:
        for fd in fds:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_driver_holding_1100_fds_serves_blocking_waits_and_timeouts(
    many_fds: list[int], make_executor: Callable[..., MultiprocExecutor]
) -> None:
    ex = make_executor()
    assert ex._res.cancel_r > 1024 and min(h.reply_bell.fileno() for h in ex._res.handles) > 1024
    assert ex.collective_rpc("echo", args=(1,), timeout=20) == [1, 1]
    # sleep makes the driver (and idle workers) go past yielding into the blocking wait
    assert ex.collective_rpc("sleep", args=(0.05,), timeout=20) == [0.05, 0.05]
    future = ex.collective_rpc("sleep", args=(0.05,), non_block=True)
    assert future.result(timeout=20) == [0.05, 0.05]
    with pytest.raises(TimeoutError):
        ex.collective_rpc("sleep", args=(2,), timeout=0.1)
    assert ex.collective_rpc("echo", args=(b"x" * (3 << 20),), timeout=20) == [b"x" * (3 << 20)] * 2
    assert not ex.is_failed


_LIMITED = r"""
import resource, sys
from executor import ExecutorConfig, MultiprocExecutor, ResourceLimitError

soft, hard = int(sys.argv[1]), int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
cfg = ExecutorConfig(worker="executor.workers:EchoWorker", tensor_parallel_size=int(sys.argv[3]),
                     chunk_bytes=1 << 16, n_chunks=4, start_method="fork")
try:
    with MultiprocExecutor(cfg) as ex:
        ok = ex.collective_rpc("echo", args=(7,), timeout=60) == [7] * cfg.world_size
        print("served", ok, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
except ResourceLimitError as exc:
    print("refused:", exc)
except BaseException as exc:
    print("other:", type(exc).__name__, exc)
"""


def _run_limited(soft: int, hard: int, tp: int) -> str:
    out = subprocess.run([sys.executable, "-c", _LIMITED, str(soft), str(hard), str(tp)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    return out.stdout.strip() + out.stderr[-1500:]


def test_more_workers_than_the_hard_open_files_limit_fits_are_refused_up_front() -> None:
    out = _run_limited(256, 256, 64)
    assert out.startswith("refused:") and "RLIMIT_NOFILE allows 256" in out, out
    assert "nothing was started" in out, out


def test_a_low_soft_open_files_limit_is_raised_to_the_hard_limit_for_many_workers() -> None:
    out = _run_limited(256, 4096, 64)
    assert out.startswith("served True 4096"), out
