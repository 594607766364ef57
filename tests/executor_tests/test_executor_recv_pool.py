"""The receive pool (issue 14): large array/tensor replies land in regions the executor owns
and reuses, so a warm driver takes no page faults for them, and never while they are in use.

Checked here with real worker processes: arrays and tensors of 1, 8 and 32 MiB round trip
intact; a region is lent again only after every array, tensor or view of it died (a live
result, or a slice of one, is never overwritten by a later call); it is lent again after
release (same address, few page faults); a result outlives ``shutdown``; a fork child gets
private copies and an empty pool; bytearray values stay bytearrays; the bounds hold; many
threads taking and dropping loans at once never share a region; once the last executor of
a process is gone the pool holds no memory, even for results dropped later.
"""

from __future__ import annotations

import gc
import os
import resource
import subprocess
import sys
import threading
import warnings
from collections.abc import Iterator
from typing import Any

import leaks
import numpy as np
import pytest
import torch

from executor import ExecutorConfig, MultiprocExecutor, recv_pool
from executor.recv_pool import KEEP_PER_CLASS, RecvPool, pool

pytestmark = pytest.mark.timeout(120)
MiB = 1 << 20


@pytest.fixture(scope="module")
def echo() -> Iterator[MultiprocExecutor]:
    """Two forked echo workers, shared by this module's tests (the pool is the driver's);
    conftest's leak check runs once around the module instead of around each test."""
    before = leaks.shm_names()
    ex = MultiprocExecutor(ExecutorConfig(tensor_parallel_size=2, start_method="fork"))
    yield ex
    ex.shutdown()
    problems = leaks.check(before)
    assert not problems, "; ".join(problems)


@pytest.fixture(autouse=True)
def no_leaks() -> Iterator[None]:
    """Per test (overriding conftest's, which the shared executor would trip): no new file
    descriptors, as anonymous regions have none."""
    gc.collect()
    before = set(os.listdir("/proc/self/fd"))
    yield
    gc.collect()
    assert set(os.listdir("/proc/self/fd")) <= before


def _call(ex: MultiprocExecutor, x: Any) -> list[Any]:
    return ex.collective_rpc("echo", args=(x,))


def _tensor(size: int, start: int = 0) -> torch.Tensor:
    return torch.arange(start, start + size // 4, dtype=torch.int32)


def _pointers(results: list[torch.Tensor]) -> set[int]:
    return {t.data_ptr() for t in results}


@pytest.mark.parametrize("size", [MiB, 8 * MiB, 32 * MiB])
def test_tensors_round_trip_through_the_pool(echo: MultiprocExecutor, size: int) -> None:
    created = pool.created
    for start in (0, 7):
        sent = _tensor(size, start).reshape(4, -1)
        got = _call(echo, sent)
        assert all(type(t) is torch.Tensor and torch.equal(t, sent) for t in got)
        assert all(t.numpy().flags.writeable for t in got)
        del got  # its regions come back for the next call
    assert pool.created - created <= 2  # the second call reused the first call's regions


@pytest.mark.parametrize("size", [MiB, 8 * MiB, 32 * MiB])
def test_ndarrays_round_trip_through_the_pool(echo: MultiprocExecutor, size: int) -> None:
    sent = np.linspace(0.0, 1.0, size // 8).reshape(-1, 2)
    nested = {"a": sent, "b": [sent[::-1].copy(), "text"]}
    for got in _call(echo, nested):
        assert type(got["a"]) is np.ndarray and got["a"].dtype == sent.dtype
        assert np.array_equal(got["a"], sent) and np.array_equal(got["b"][0], sent[::-1])
        assert got["b"][1] == "text" and not np.shares_memory(got["a"], got["b"][0])


def test_a_live_result_is_never_lent_again(echo: MultiprocExecutor) -> None:
    first = _call(echo, _tensor(8 * MiB))
    second = _call(echo, _tensor(8 * MiB, 1000))
    for a in first:
        assert torch.equal(a, _tensor(8 * MiB))
        assert all(not np.shares_memory(a.numpy(), b.numpy()) for b in second)
    assert not _pointers(first) & _pointers(second)


def test_a_view_of_a_dropped_result_keeps_its_region(echo: MultiprocExecutor) -> None:
    """Slices and memoryviews of a result hold its region, not only the result itself, even
    a slice of the memoryview at the root of its base chain (the pool's own view)."""
    sent = np.arange(2 * MiB, dtype=np.int32)
    first = _call(echo, sent)
    view = first[0][100:200]
    raw = memoryview(first[1])[50:60]
    root: Any = first[1]
    while not isinstance(root, memoryview):
        root = root.base
    root_slice = root[4 * 1000 : 4 * 1010].cast("i")
    del first, root
    gc.collect()
    for _ in range(3):
        _call(echo, sent + 5000)
    assert view.tolist() == list(range(100, 200))
    assert raw.tolist() == list(range(50, 60))
    assert root_slice.tolist() == list(range(1000, 1010))


def test_a_region_is_lent_again_after_release(echo: MultiprocExecutor) -> None:
    first = _call(echo, _tensor(32 * MiB))
    pointers = _pointers(first)
    del first
    sent = _tensor(32 * MiB, 3)  # its own ~8k faults come before the count
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    again = _call(echo, sent)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    assert _pointers(again) == pointers
    assert faults < 2 * (32 * MiB // 4096) // 4  # a fresh pair would take ~16k faults
    assert all(torch.equal(t, _tensor(32 * MiB, 3)) for t in again)


def test_a_result_outlives_shutdown() -> None:
    ex = MultiprocExecutor(ExecutorConfig(tensor_parallel_size=2, start_method="fork"))
    try:
        got = _call(ex, _tensor(8 * MiB, 11))
    finally:
        ex.shutdown()
    gc.collect()
    assert all(torch.equal(t, _tensor(8 * MiB, 11)) for t in got)
    got[0].add_(1)  # still writable memory
    assert int(got[0][0]) == 12


def test_bytearray_values_stay_bytearrays(echo: MultiprocExecutor) -> None:
    value = bytearray(os.urandom(2 * MiB))
    for got in _call(echo, (value, np.frombuffer(bytes(value), dtype=np.uint8))):
        assert type(got[0]) is bytearray and got[0] == value
        assert type(got[1]) is np.ndarray and got[1].tobytes() == value


def test_a_fork_child_gets_private_copies_and_an_empty_pool(echo: MultiprocExecutor) -> None:
    live = _call(echo, _tensor(8 * MiB))
    mine = live[0].numpy()  # the child writes through numpy: torch's thread pool hangs in a fork child
    _call(echo, _tensor(8 * MiB))  # returned: the parent's pool now holds free regions
    assert pool.free_bytes() > 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads: deliberate
        pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            empty = pool.free_bytes() == 0
            mine.fill(-1)  # the child's copy-on-write copy
            loan = pool.take(8 * MiB)
            loan[:] = b"\xff" * len(loan)
            code = 0 if empty else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert all(torch.equal(t, _tensor(8 * MiB)) for t in live)
    again = _call(echo, _tensor(8 * MiB, 9))  # regions the child wrote to, in its copy only
    assert all(torch.equal(t, _tensor(8 * MiB, 9)) for t in again)


def test_bounds_on_free_regions(monkeypatch: pytest.MonkeyPatch) -> None:
    own = RecvPool()
    own.open_user()
    loans = [own.take(MiB) for _ in range(KEEP_PER_CLASS + 3)]
    del loans
    assert own.free_bytes() == KEEP_PER_CLASS * MiB
    monkeypatch.setattr(recv_pool, "KEEP_BYTES", 5 * MiB)
    other = RecvPool()
    other.open_user()
    big = [other.take(2 * MiB) for _ in range(KEEP_PER_CLASS)]
    del big
    assert other.free_bytes() == 4 * MiB  # a third 2 MiB region would pass KEEP_BYTES


def test_threads_never_share_a_region() -> None:
    own = RecvPool()
    own.open_user()
    errors: list[str] = []

    def work(mark: int) -> None:
        for i in range(40):
            loan = own.take(MiB + i)
            loan[:] = bytes([mark]) * len(loan)
            if i % 7 == 0:
                gc.collect()
            if loan[:: 4096].tobytes() != bytes([mark]) * len(loan[:: 4096]):
                errors.append(f"thread {mark}: region changed under its loan")
            del loan

    threads = [threading.Thread(target=work, args=(m,)) for m in range(1, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert own.created < 4 * 40 // 2  # reused, not one region per loan


def test_the_pool_holds_memory_only_while_it_has_a_user() -> None:
    own = RecvPool()
    own.open_user()
    kept = own.take(MiB)
    dropped = own.take(MiB)
    del dropped
    assert own.free_bytes() == MiB
    own.close_user()  # the last executor shut down: nothing is kept
    assert own.free_bytes() == 0
    del kept  # a loan that dies afterwards is unmapped, not kept
    gc.collect()
    assert own.free_bytes() == 0 and not own._returned


def test_the_last_executor_leaves_no_pooled_memory_behind() -> None:
    """In a fresh process: after shutdown, and after the caller drops a result it kept
    across shutdown, the driver's pool holds nothing."""
    script = """if True:
        import gc, torch
        from executor import ExecutorConfig, MultiprocExecutor
        from executor.recv_pool import pool
        ex = MultiprocExecutor(ExecutorConfig(tensor_parallel_size=2, start_method="fork"))
        kept = ex.collective_rpc("echo", args=(torch.ones(2 << 20),))  # 8 MiB: pooled
        ex.collective_rpc("echo", args=(torch.ones(2 << 20),))
        assert pool.free_bytes() > 0, "the dropped reply went back to the pool"
        ex.shutdown()
        assert pool.free_bytes() == 0, pool.free_bytes()
        assert float(kept[0].sum()) == 2 << 20  # still valid after shutdown
        del kept
        gc.collect()
        assert pool.free_bytes() == 0 and not pool._returned
        print("ok")
    """
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=100)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
