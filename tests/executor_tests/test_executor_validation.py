"""Values checked before anything is sent or started, with clear messages; a start method
that does not depend on what else the program runs."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from executor import ExecutorConfig, MultiprocExecutor
from executor.config import DEFAULT_START_METHOD


@pytest.mark.parametrize("field", ["startup_timeout", "enqueue_timeout", "shutdown_grace",
                                   "sigterm_grace", "worker_exit_grace", "node_timeout"])
@pytest.mark.parametrize("value", [float("inf"), 1e20, float("nan"), 0, -1])
def test_config_rejects_infinite_huge_or_non_positive_durations(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        ExecutorConfig(**{field: value})  # type: ignore[arg-type]


@pytest.mark.parametrize("timeout", [1e20, float("inf"), float("nan"), 0, -1, True, "1"])
def test_a_bad_call_timeout_is_rejected_before_sending(executor: MultiprocExecutor, timeout: Any) -> None:
    with pytest.raises(ValueError, match="timeout"):
        executor.collective_rpc("echo", args=(1,), timeout=timeout)
    assert executor.collective_rpc("echo", args=(1,), timeout=10) == [1, 1]


def test_a_nan_result_timeout_is_rejected(executor: MultiprocExecutor) -> None:
    future = executor.collective_rpc("echo", args=(1,), non_block=True)
    with pytest.raises(ValueError, match="timeout"):
        future.result(timeout=float("nan"))
    assert future.result(timeout=10) == [1, 1]


def test_the_default_start_method_ignores_other_threads() -> None:
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, name="unrelated")
    before = ExecutorConfig().resolved_start_method()
    thread.start()
    try:
        assert ExecutorConfig().resolved_start_method() == before == DEFAULT_START_METHOD
    finally:
        stop.set()
        thread.join()
