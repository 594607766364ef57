"""Start-up: a worker that fails before READY makes the constructor raise its own error."""

from __future__ import annotations

import time

import pytest

from executor import WorkerStartupError


def test_constructor_exception_carries_the_workers_traceback(make_executor) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(WorkerStartupError) as info:
        make_executor(worker_kwargs={"fail_on_start": True})
    message = str(info.value)
    assert "was asked to fail on start" in message
    assert "Worker traceback" in message and "RuntimeError" in message


def test_unknown_worker_module(make_executor) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(WorkerStartupError, match="No module named 'no_such_module'"):
        make_executor(worker="no_such_module:Worker")


def test_unknown_worker_class(make_executor) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(WorkerStartupError, match="NoSuchWorker"):
        make_executor(worker="executor.workers:NoSuchWorker")


def test_worker_dying_before_ready(make_executor) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(WorkerStartupError, match=r"rank 1 .*exited with code 9 before reporting READY"):
        make_executor(worker="exec_helpers:ExitOnStartWorker")


def test_startup_timeout(make_executor) -> None:  # type: ignore[no-untyped-def]
    start = time.monotonic()
    with pytest.raises(WorkerStartupError, match="did not report READY within 1 s"):
        make_executor(worker="exec_helpers:SlowStartWorker", startup_timeout=1.0)
    assert time.monotonic() - start < 15  # the slow workers were stopped, not waited for


def test_workers_answer_right_after_start(make_executor) -> None:  # type: ignore[no-untyped-def]
    ex = make_executor(tensor_parallel_size=3)
    assert ex.collective_rpc("get_rank") == [0, 1, 2]


def test_workers_see_the_drivers_environment_of_now(make_executor, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    make_executor().shutdown()  # a forkserver, if any, starts with the old environment
    monkeypatch.setenv("FAULTLAB_TEST_MARK", "set-after-the-forkserver-started")
    ex = make_executor()
    marks = ex.collective_rpc(lambda w: __import__("os").environ.get("FAULTLAB_TEST_MARK"))
    assert marks == ["set-after-the-forkserver-started"] * 2
