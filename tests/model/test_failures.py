"""Faults during generation and start-up: the engine fails every pending request with an
error that names the rank, within bounded time, and nothing hangs or leaks.

    fault            where                        expected outcome
    SIGKILL          a rank, mid-generation       EngineFailedError naming "worker rank N"
    SIGSTOP          a rank, mid-generation       step timeout, naming the stopped rank
    load failure     one rank's constructor       WorkerStartupError with its own traceback
"""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import Future

import pytest
from model_helpers import PROMPTS, model_config, signal_later

from executor import MultiprocExecutor, WorkerStartupError
from executor.model.engine import EngineFailedError, LLMEngine, RequestFailedError

FAULT_AFTER_S = 0.4
LONG_RUN_TOKENS = 400  # several seconds of generation: the fault lands mid-run
DETECTION_BOUND_S = 5.0  # fault to EngineFailedError (death detection + the 1 s grace)


def _add_long_requests(engine: LLMEngine) -> list[Future[list[int]]]:
    return [engine.add_request(rid, prompt, LONG_RUN_TOKENS) for rid, prompt in PROMPTS.items()]


def _assert_all_failed(futures: list[Future[list[int]]], pattern: str) -> None:
    for future in futures:
        error = future.exception(timeout=0)
        assert isinstance(error, RequestFailedError), error
        assert pattern in str(error), str(error)


@pytest.mark.parametrize("tp, pp, rank", [
    pytest.param(2, 1, 1, id="tp2-peer-rank"),
    pytest.param(2, 1, 0, id="tp2-output-rank"),
    pytest.param(1, 2, 0, id="pp2-first-stage"),
    pytest.param(1, 1, 0, id="tp1-async"),
])
def test_killed_rank_fails_every_pending_request(tp: int, pp: int, rank: int) -> None:
    cfg = model_config(tp, pp, async_scheduling=(tp, pp) == (1, 1))
    with MultiprocExecutor(cfg) as executor:
        engine = LLMEngine(executor, step_timeout=30)
        futures = _add_long_requests(engine)
        timer = signal_later(executor.worker_pids[rank], signal.SIGKILL, FAULT_AFTER_S)
        started = time.monotonic()
        with pytest.raises(EngineFailedError) as failure:
            engine.run()
        timer.join()
        assert time.monotonic() - started < FAULT_AFTER_S + DETECTION_BOUND_S
        assert executor.is_failed
    expected = f"worker rank {rank} (pid {executor.worker_pids[rank]}) was killed by SIGKILL"
    assert expected in str(failure.value)
    _assert_all_failed(futures, expected)
    with pytest.raises(EngineFailedError, match=f"worker rank {rank}"):
        engine.add_request("late", [1, 2, 3], 4)


def test_killing_a_stopped_rank_frees_its_peer_waiting_in_all_reduce() -> None:
    """SIGSTOP first, so rank 0 is surely blocked in the step's all-reduce; then SIGKILL."""
    with MultiprocExecutor(model_config(tp=2)) as executor:
        engine = LLMEngine(executor, step_timeout=30)
        futures = _add_long_requests(engine)
        pid = executor.worker_pids[1]
        timers = [signal_later(pid, signal.SIGSTOP, FAULT_AFTER_S),
                  signal_later(pid, signal.SIGKILL, FAULT_AFTER_S + 0.5)]
        started = time.monotonic()
        with pytest.raises(EngineFailedError) as failure:
            engine.run()
        for timer in timers:
            timer.join()
        assert time.monotonic() - started < FAULT_AFTER_S + 0.5 + DETECTION_BOUND_S
    expected = f"worker rank 1 (pid {pid}) was killed by SIGKILL"
    assert expected in str(failure.value)
    _assert_all_failed(futures, expected)


def test_stopped_rank_is_caught_by_the_step_timeout() -> None:
    step_timeout = 1.0
    with MultiprocExecutor(model_config(tp=2)) as executor:
        engine = LLMEngine(executor, step_timeout=step_timeout)
        futures = _add_long_requests(engine)
        pid = executor.worker_pids[1]
        timer = signal_later(pid, signal.SIGSTOP, FAULT_AFTER_S)
        try:
            started = time.monotonic()
            with pytest.raises(EngineFailedError, match=r"step timeout of 1\.0s") as failure:
                engine.run()
            assert time.monotonic() - started < FAULT_AFTER_S + step_timeout + 2.0
        finally:
            timer.join()
            os.kill(pid, signal.SIGCONT)  # let shutdown end it the ordinary way
    assert f"rank 1 (pid {pid}) stopped" in str(failure.value)
    assert isinstance(failure.value.__cause__, TimeoutError)
    _assert_all_failed(futures, "step timeout")


def test_invalid_layout_fails_start_up_with_the_workers_traceback() -> None:
    cfg = model_config(tp=2, worker_kwargs={"num_heads": 3, "hidden_size": 96,
                                            "mlp_size": 384})
    with pytest.raises(WorkerStartupError) as failure:
        MultiprocExecutor(cfg)
    text = str(failure.value)
    assert "tensor_parallel_size=2 must divide num_heads=3" in text
    assert "executor/model/config.py" in text and "in validate" in text


@pytest.mark.parametrize("fail_when, message", [
    ("before_init", "model files missing on this host"),  # rank 0 waits at the rendezvous
    ("while_loading", "weights file is corrupt"),  # rank 0 is READY already
])
def test_one_rank_failing_to_load_fails_start_up(fail_when: str, message: str) -> None:
    cfg = model_config(tp=2, worker="model_helpers:FailingModelWorker",
                       worker_kwargs={"fail_rank": 1, "fail_when": fail_when})
    started = time.monotonic()
    with pytest.raises(WorkerStartupError) as failure:
        MultiprocExecutor(cfg)
    assert time.monotonic() - started < 15
    text = str(failure.value)
    assert "rank 1" in text and message in text and "model_helpers.py" in text


def test_a_model_error_fails_every_pending_request_naming_the_rank() -> None:
    """A request too long for the model: every rank refuses the step, the executor lives."""
    with MultiprocExecutor(model_config(tp=2, worker_kwargs={"max_positions": 16})) as executor:
        engine = LLMEngine(executor, step_timeout=30)
        futures = [engine.add_request("short", [1, 2], 4),
                   engine.add_request("long", list(range(20)), 4)]
        with pytest.raises(EngineFailedError) as failure:
            engine.run()
        assert not executor.is_failed
    text = str(failure.value)
    assert text.startswith("engine failed at step 0: WorkerError: rank 0"), text
    assert "20 tokens exceed max_positions=16" in text
    _assert_all_failed(futures, "exceed max_positions=16")
