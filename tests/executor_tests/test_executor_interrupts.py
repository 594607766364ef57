"""Ctrl-C in the driver at any instant: KeyboardInterrupt reaches the caller, the executor
stays usable and in step (the interrupted call's replies are drained and dropped), and an
interrupt is never reported as memory damage."""

from __future__ import annotations

import os
import random
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

import pytest

from executor import MultiprocExecutor, failpoints

sys.path.insert(0, os.path.dirname(__file__))
import outsider_helpers as helpers


def _sigint_after(delay: float) -> threading.Timer:
    """A timer that sends SIGINT to this process; start it inside the ``try`` that catches
    KeyboardInterrupt: with a tiny delay the signal can land while ``start()`` still waits."""
    return threading.Timer(delay, os.kill, (os.getpid(), signal.SIGINT))


def _call_in_step(ex: MultiprocExecutor, i: int) -> None:
    assert ex.collective_rpc("echo", args=(i,), timeout=20) == [i, i]


@pytest.mark.parametrize("seed", [1, 2])
def test_sigint_at_random_instants_of_a_streamed_reply(
    make_executor: Callable[..., MultiprocExecutor], seed: int
) -> None:
    ex = make_executor(chunk_bytes=1 << 16, n_chunks=4)  # a 2 MiB echo streams 32 chunks each way
    payload = os.urandom(2 << 20)
    rng = random.Random(seed)
    interrupted = 0
    for i in range(40):
        timer = _sigint_after(rng.uniform(0.0, 0.015))
        try:
            try:
                timer.start()
                assert ex.collective_rpc("echo", args=(payload,), timeout=20) == [payload, payload]
            finally:
                timer.join()
        except KeyboardInterrupt:
            interrupted += 1
        assert not ex.is_failed
        _call_in_step(ex, i)
    assert interrupted == 40  # every signal arrived as KeyboardInterrupt, wherever it landed


def _interrupt_once(point: str) -> Callable[..., None]:
    fired: list[bool] = []

    def action(**_: Any) -> None:
        if not fired:
            fired.append(True)
            raise KeyboardInterrupt

    failpoints.enable(point, action)
    return action


@pytest.mark.parametrize("point", [
    "driver.before_pickle", "driver.before_enqueue", "driver.after_enqueue",
    "driver.before_dequeue", "driver.after_dequeue", "queue.mid_chunk_write",
])
def test_keyboard_interrupt_at_each_driver_phase(
    make_executor: Callable[..., MultiprocExecutor], point: str
) -> None:
    ex = make_executor(chunk_bytes=1 << 16, n_chunks=4)
    payload = os.urandom(1 << 20)
    _interrupt_once(point)
    try:
        with pytest.raises(KeyboardInterrupt):
            ex.collective_rpc("echo", args=(payload,), timeout=20)
    finally:
        failpoints.disable()
    assert not ex.is_failed
    for i in range(3):
        _call_in_step(ex, i)


def test_keyboard_interrupt_while_unpickling_a_reply_is_a_keyboard_interrupt(
    make_executor: Callable[..., MultiprocExecutor], monkeypatch: pytest.MonkeyPatch
) -> None:
    ex = make_executor()
    monkeypatch.setenv(helpers.DRIVER_PID_VAR, str(os.getpid()))
    helpers.interrupted.clear()
    with pytest.raises(KeyboardInterrupt):
        ex.collective_rpc("echo", args=(helpers.InterruptOnceInDriver(),), timeout=20)
    assert not ex.is_failed
    _call_in_step(ex, 1)


# ---------------------------------------------------------------- every point, not random timing

_SWEPT_CALLS: dict[str, Callable[[MultiprocExecutor], Any]] = {
    "blocking": lambda ex: ex.collective_rpc("echo", args=(b"x",), timeout=10),
    "non_block": lambda ex: ex.collective_rpc("echo", args=(b"y",), timeout=10, non_block=True).result(),
    "unique_rank": lambda ex: ex.collective_rpc("echo", args=(3,), timeout=10, unique_reply_rank=1),
    "streamed": lambda ex: ex.collective_rpc("echo", args=(b"z" * (3 << 12),), timeout=10),
}


@pytest.mark.parametrize("kind", sorted(_SWEPT_CALLS))
def test_keyboard_interrupt_at_every_point_of_a_call_leaves_no_lock_held_and_the_queue_in_step(
    make_executor: Callable[..., MultiprocExecutor], kind: str
) -> None:
    """KeyboardInterrupt raised at every point of the call where CPython can raise it (after
    each call returns, on each backward jump, in executor/), one point per run."""
    from chaos.interrupt_sweep import sweep_interrupts

    ex = make_executor(chunk_bytes=1 << 12, n_chunks=4)  # "streamed" spans 3+ chunks each way
    call = _SWEPT_CALLS[kind]
    report = sweep_interrupts(ex, lambda: call(ex), budget_s=60)
    assert report.violations == [], report.violations[:5]
    assert report.hit >= 0.8 * len(report.points) and report.hit > 50, report.summary()


def test_the_interrupt_sweep_finds_a_lock_taken_before_its_try() -> None:
    """The round-3 wedge, planted (chaos.mutants.LocksBeforeTry): the sweep names the lock."""
    from chaos.interrupt_sweep import sweep_interrupts
    from chaos.mutants import LocksBeforeTry
    from executor import ExecutorConfig

    ex = LocksBeforeTry(ExecutorConfig(worker="executor.workers:EchoWorker", tensor_parallel_size=2))
    try:  # the sweep also traces the mutant's own file (chaos/mutants.py): code_roots(ex)
        report = sweep_interrupts(ex, lambda: ex.collective_rpc("echo", args=(1,), timeout=10),
                                  budget_s=60)
    finally:
        ex._res.reply_lock = ex._collector.lock = threading.RLock()  # let shutdown take it
        ex.shutdown()
    assert any("reply_lock left held" in v for v in report.violations), report.summary()
