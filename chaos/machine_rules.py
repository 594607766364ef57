"""``SurroundingsMachine``: the executor state machine plus what surrounds the executor.

    ExecutorMachine (chaos.machine) ──► SurroundingsMachine adds rules:
        burst                 8 / 40 / 200 outstanding non_block calls, then result() of the last
        interrupt             SIGINT to the driver (main thread) while a 3 MiB echo streams
        nested_callback_call  a done-callback that calls collective_rpc
        raising_aggregator    that call fails; later calls (judged by the model) do not
        damage_next_request   one payload byte of the next request flipped: a checksum error
        stubborn_worker       a worker ignoring SIGTERM and the death pipe: shutdown must SIGKILL
    SurroundingsMachine ──► InterruptPointsMachine adds (a machine of its own, as below):
        interrupt_at_points   KeyboardInterrupt at each point of a window of an echo's points
                              where CPython can raise it (chaos.interrupt_sweep): no lock held
    SurroundingsMachine ──► OutsideReaperMachine adds (a machine of its own, so the hunts above
    keep their rule set):
        outside_reaper        from now on someone else reaps the driver's children (SIGCHLD
                              SIG_IGN, or a waitpid(-1) reaper): deaths are still named
                              (rank, pid, never "still running"), shutdown stays bounded

Every rule is bounded like the base machine's (a hang is a failure with a message).  The
interrupt rule runs its call on the calling (main) thread with a SIGINT handler that raises
only while armed, so a late signal never lands in Hypothesis' own code.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from chaos import points, surroundings
from chaos.machine import WORLD_SIZE, ExecutorMachine, _signal
from chaos.workloads import CallSpec
from executor import CorruptMessageError, ExecutorFailedError, WorkerError, failpoints
from executor.shm_queue import ChunkMeta

_MIB = 1 << 20
POINTS_PER_RULE = 24  # one run each, ~2 ms: a window costs about 50 ms


class ChaosAggregatorError(RuntimeError):
    pass


def _raising_aggregator(values: list[Any]) -> Any:
    raise ChaosAggregatorError("chaos: the aggregator raises")


def _stubborn(worker: Any, rank: int) -> int:
    """On ``rank``: ignore SIGTERM, block the death-pipe watcher, never return."""
    if worker.rank != rank:
        return int(worker.rank)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    failpoints.enable("worker.death_pipe", lambda **_: time.sleep(3600))
    while True:
        time.sleep(1)


class SurroundingsMachine(ExecutorMachine):
    """ExecutorMachine with rules for bursts, Ctrl-C, callbacks, queue damage, stubborn workers."""

    def __init__(self) -> None:
        super().__init__()
        self.stubborn: set[int] = set()
        # An interrupted streamed write leaves its stream for the next write to finish (an
        # abort marker): "the next chunk published" may then be that, not the next request.
        self._stream_cut = False

    def _quiet_model(self) -> bool:
        """No backlog and no stopped worker: a call must then finish well within 2 s."""
        return not self.model.stopped and max(self.model.busy_until) <= time.monotonic()

    @precondition(lambda self: not self.model.stopped)
    @rule(n=st.sampled_from([8, 40, 200]))
    def burst(self, n: int) -> None:
        calls = [self._submit(CallSpec("echo", ("",), None, True)) for _ in range(n)]
        last = calls[-1]
        if last.future is not None:
            bound = self.model.drain_bound(last.index, time.monotonic())
            self._run_bounded(f"burst of {n}: {last!r}.result()", last.future.result, bound)
        self.model.settled_upto = max(self.model.settled_upto, last.index + 1)
        self._judge_resolved()

    @precondition(lambda self: not self.model.stopped)
    @rule(delay=st.sampled_from([0.0, 0.002, 0.01, 0.03]))
    def interrupt(self, delay: float) -> None:
        """Ctrl-C mid-call: KeyboardInterrupt or the call's own value, nothing else."""
        payload = f"interrupted-{len(self.model.calls)}|" * (3 * _MIB // 20)
        failed = self.model.failed_at is not None
        value, error = _interrupted_call(
            lambda: self.ex.collective_rpc("echo", args=(payload,), timeout=5.0), delay)
        if error is None:
            assert value == [payload] * WORLD_SIZE, "an interrupted-then-finished call got another value"
            return
        self._stream_cut = self._stream_cut or isinstance(error, KeyboardInterrupt)
        allowed: tuple[type[BaseException], ...] = (KeyboardInterrupt,)
        if failed or self.model.failed_at is not None:
            allowed += (ExecutorFailedError,)
        if not self._quiet_model():
            allowed += (TimeoutError,)
        assert isinstance(error, allowed), (
            f"SIGINT {delay:g} s into a 3 MiB echo: the caller got {type(error).__name__}: "
            f"{error} instead of KeyboardInterrupt")

    @precondition(lambda self: not self.model.stopped)
    @rule()
    def nested_callback_call(self) -> None:
        quiet = self._quiet_model() and self.model.failed_at is None
        outer = self._submit(CallSpec("echo", ("",), 2.0, True))
        if outer.future is None:
            return
        nested: dict[str, Any] = {}

        def callback(_: Any) -> None:
            try:
                nested["value"] = self.ex.collective_rpc("echo", args=("nested",), timeout=2.0)
            except Exception as exc:  # noqa: BLE001 - judged below
                nested["error"] = exc

        outer.future.add_done_callback(callback)
        bound = self.model.drain_bound(outer.index, time.monotonic()) + 2.0 + self.slack_s
        self._run_bounded(f"{outer!r}.result() with a nested call", outer.future.result, bound)
        self.model.settled_upto = max(self.model.settled_upto, outer.index + 1)
        self._judge_resolved()
        if quiet and self.model.failed_at is None:
            assert nested.get("value") == ["nested"] * WORLD_SIZE, (
                f"collective_rpc inside a done-callback ended in {nested!r}")

    @rule()
    def raising_aggregator(self) -> None:
        call = lambda: self.ex.collective_rpc(  # noqa: E731
            "echo", args=("aggregated",), timeout=2.0, aggregator=_raising_aggregator)
        _, error, _ = self._run_bounded("a call with a raising aggregator", call,
                                        time.monotonic() + 2.0 + self.slack_s)
        assert isinstance(error, (ChaosAggregatorError, TimeoutError, ExecutorFailedError)), (
            f"a raising aggregator's call ended in {error!r}")

    @precondition(lambda self: self.model.failed_at is None and not self.model.stopped)
    @rule()
    def damage_next_request(self) -> None:
        """Flip a payload byte of the next request: the workers' checksum must catch it."""
        def damage(ring: Any, index: int, **_: Any) -> None:
            failpoints.disable("queue.before_publish")
            meta = ChunkMeta(ring.buf, ring.metas[index])
            points.DAMAGE["flip_payload"](meta, ring.buf, ring.datas[index], 0)

        failpoints.enable("queue.before_publish", damage)
        try:
            value, error, _ = self._run_bounded(
                "a damaged request", lambda: self.ex.collective_rpc("echo", args=("x",), timeout=2.0),
                time.monotonic() + 2.0 + self.slack_s)
        finally:
            failpoints.disable("queue.before_publish")
        caught = isinstance(error, CorruptMessageError) or (
            isinstance(error, WorkerError) and "Corrupt" in f"{error.exc_type} {error}")
        # After a cut stream the damage may land on its abort marker; the request is then intact.
        intact = self._stream_cut and error is None and value == ["x"] * WORLD_SIZE
        self._stream_cut = False
        assert caught or intact or isinstance(error, TimeoutError), (
            f"a request with a flipped payload byte ended in {error!r} / {value!r}, "
            "not a checksum error")

    @precondition(lambda self: self.model.failed_at is None and not self.model.stopped
                  and not self.model.unresolved_without_deadline())
    @rule(rank=st.integers(0, WORLD_SIZE - 1))
    def stubborn_worker(self, rank: int) -> None:
        """A worker that ignores SIGTERM and the death pipe: only SIGKILL ends it."""
        self.ex.collective_rpc(_stubborn, args=(rank,), timeout=0.05, non_block=True)
        self.model.stopped[rank] = time.monotonic()  # busy for good: like a stopped worker
        self.stubborn.add(rank)

    @precondition(lambda self: self.model.failed_at is None)
    @rule(rank=st.integers(0, WORLD_SIZE - 1), sig=st.sampled_from(["SIGKILL", "SIGTERM"]))
    def kill(self, rank: int, sig: str) -> None:
        """As the base rule; a stubborn worker ignores SIGTERM, so it gets SIGKILL."""
        super().kill(rank, "SIGKILL" if rank in self.stubborn else sig)

    @precondition(lambda self: bool(self.model.stopped))
    @rule(rank=st.integers(0, WORLD_SIZE - 1))
    def resume(self, rank: int) -> None:
        """SIGCONT a worker; a stubborn one stays busy."""
        _signal(self.pids[rank], signal.SIGCONT)
        if rank in self.model.stopped and rank not in self.stubborn:
            self.model.resume(rank, time.monotonic())


class OutsideReaperMachine(SurroundingsMachine):
    """SurroundingsMachine plus someone else reaping the driver's children (issue 25)."""

    def __init__(self) -> None:
        super().__init__()
        self.reaper: surroundings.ChildReaper | None = None  # stopped after teardown's shutdown

    @precondition(lambda self: self.reaper is None)
    @rule(mode=st.sampled_from(surroundings.REAPER_MODES))
    def outside_reaper(self, mode: str) -> None:
        """Someone else reaps the driver's children from now on, until after teardown."""
        self.reaper = surroundings.ChildReaper(mode)

    @precondition(lambda self: self.model.failed_at is None)
    @rule(rank=st.integers(0, WORLD_SIZE - 1), sig=st.sampled_from(["SIGKILL", "SIGTERM"]))
    def kill(self, rank: int, sig: str) -> None:
        """As the base rule; the failure names the dead worker, whoever reaped it."""
        super().kill(rank, sig)
        failure = str(getattr(self.ex, "_failure", "") or "")
        assert str(self.pids[rank]) in failure and "still running" not in failure, (
            f"{sig} of rank {rank} (pid {self.pids[rank]}) was reported as: {failure}")

    def teardown(self) -> None:
        try:
            super().teardown()
        finally:
            if self.reaper is not None:
                self.reaper.stop()


class InterruptPointsMachine(SurroundingsMachine):
    """SurroundingsMachine plus Ctrl-C at every point of a call (issue 25): a machine of its
    own, so that the other hunts keep their rule set and their budgets."""

    def __init__(self) -> None:
        super().__init__()
        self._points: list[str] | None = None  # the swept echo's points, found once

    @precondition(lambda self: not self.model.stopped and self.model.failed_at is None)
    @rule(window=st.integers(0, 63))
    def interrupt_at_points(self, window: int) -> None:
        """KeyboardInterrupt at each of POINTS_PER_RULE consecutive points of a blocking echo
        where CPython can raise it (window ``window`` of the call's distinct points, one run
        each: chaos.interrupt_sweep); after each, no lock of the executor is held."""
        from chaos import interrupt_sweep as sweep

        def call() -> Any:
            return self.ex.collective_rpc("echo", args=("point",), timeout=5.0)

        roots = sweep.code_roots(self.ex)
        if self._points is None:
            counter = sweep.Tracer(roots, None)
            assert sweep.traced(counter, call) is None, "the echo to sweep failed by itself"
            self._points = list(counter.seen)
        first = window * POINTS_PER_RULE % len(self._points)
        for target in self._points[first:first + POINTS_PER_RULE]:
            tracer = sweep.Tracer(roots, target)
            raised = sweep.traced(tracer, call)
            if tracer.fired:
                assert isinstance(raised, KeyboardInterrupt), (
                    f"KeyboardInterrupt at {target}: the caller got {raised!r}")
                self._stream_cut = True  # it may have cut a write (see damage_next_request)
            held = sweep.held_locks(self.ex.caller_locks())
            assert not held, f"KeyboardInterrupt at {target} left lock(s) {held} held"


def _interrupted_call(fn: Any, delay: float) -> tuple[Any, BaseException | None]:
    """Run ``fn`` on this (main) thread with a SIGINT sent ``delay`` s in.  A SIGINT that
    lands inside a finalizer or weakref callback is dropped by the interpreter: then ``fn``
    simply returns, as if the signal had come after it."""
    armed = [True]

    def handler(signum: int, frame: Any) -> None:
        if armed[0]:
            armed[0] = False
            raise KeyboardInterrupt

    old = signal.signal(signal.SIGINT, handler)
    timer = threading.Timer(delay, os.kill, args=(os.getpid(), signal.SIGINT))
    timer.name = "machine-sigint"
    value: Any = None
    error: BaseException | None = None
    try:
        try:
            timer.start()
            value = fn()
            timer.join()
            time.sleep(0.001)  # a pending handler runs here, inside the try
            armed[0] = False
        except BaseException as exc:  # noqa: BLE001 - returned to the rule
            error = exc
        finally:
            armed[0] = False
            timer.join()
    finally:
        signal.signal(signal.SIGINT, old)
    return value, error
