"""``ExecutorMachine``: a Hypothesis state machine that drives a real executor and checks it.

    Hypothesis ── draws a rule ──► ExecutorMachine ──► MultiprocExecutor (2 EchoWorkers)
        ▲                              │  blocking / non-blocking calls, result() in any order,
        │                              │  short deadlines, SIGKILL / SIGTERM / SIGSTOP / SIGCONT,
        │                              │  a crash inside a method, shutdown
        │                              ▼
        │                        ExecutorModel: when each call must end by, and what it may
        │                        end in (its own value, or a documented error it has earned)
        └── shrinks the steps ◄── AssertionError from a rule's check or an invariant

Every call runs in a short-lived helper thread that the machine joins with a bound (the
call's deadline, or the model's completion estimate, plus ``slack_s``): a call that hangs
is a failure with a message, never a hung test.  ``teardown`` always shuts the executor
down, kills whatever worker is still alive and checks that nothing is left.

What the model asserts (docs/design.md, section 1.2):

- a call ends in its own result, or in an error it has earned: ``WorkerError`` carrying
  its own message (``fail``), ``TimeoutError`` no earlier than its deadline (only with
  one), ``ExecutorFailedError`` only after a fault or ``shutdown()``;
- every payload is unique (``chaos.strategies.unique_args``): a reply given to the wrong
  call is a wrong value;
- calls resolve in submission order (calls that timed out are exempt: a deadline may
  resolve a call before an earlier one without a deadline);
- a call with a deadline returns by deadline + ``slack_s``; ``result()`` of a future
  returns by the latest bound of the calls it drains, and leaves every earlier call done;
- after a worker dies, every call in flight is resolved and the failure callback has run
  exactly once within ``detect_s``; never without a fault;
- ``shutdown()`` returns within its grace periods plus slack, resolves every future and
  leaves no worker process.

Use it from a test::

    from hypothesis.stateful import run_state_machine_as_test
    run_state_machine_as_test(ExecutorMachine)          # or ExecutorMachine.TestCase

Subclass it to aim it at another executor class or start method (``executor_class``,
``start_method``): tests/property runs it against deliberately broken executors.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures
from typing import Any

import psutil
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    multiple,
    precondition,
    rule,
)

from chaos import resources
from chaos.strategies import TIMEOUTS, rpc_calls, unique_args
from chaos.workloads import CallSpec
from executor import ExecutorConfig, ExecutorFailedError, MultiprocExecutor, WorkerError

SLACK_S = 1.0  # scheduling slack on a shared, loaded 2-core machine: catches hangs, not slowness
DETECT_S = 3.0  # a dead worker must be noticed (in-flight calls failed) within this
STARTUP_S = 30.0  # a start-up that hangs fails the example instead of the whole test run
EPS_S = 0.002  # clock granularity between our stamps and the executor's
WORLD_SIZE = 2
_INF = float("inf")
_DEADLINES = tuple(t for t in TIMEOUTS if t is not None)


def _exit_on_rank(worker: Any, rank: int, code: int) -> int:
    """A method that crashes one rank mid-call (``os._exit``) and answers on the others."""
    if worker.rank == rank:
        os._exit(code)
    return int(worker.rank)


@dataclasses.dataclass(eq=False)
class ModelCall:
    """One call as the model sees it; the ``outcome`` fields are filled when it resolves."""

    index: int
    spec: CallSpec
    submitted: float  # monotonic, taken just before collective_rpc
    bound: float  # model: the call is resolved by then (deadline or completion estimate)
    future: Future[Any] | None = None
    ended: float | None = None
    seq: int | None = None  # position in the order calls resolved
    value: Any = None
    error: BaseException | None = None
    judged: bool = False

    def __repr__(self) -> str:  # what a failing step list prints
        return f"call#{self.index}({self.spec.method}{self.spec.args}, timeout={self.spec.timeout})"

    @property
    def deadline(self) -> float:
        return _INF if self.spec.timeout is None else self.submitted + self.spec.timeout

    def expected(self) -> Any:
        per_rank: Callable[[int], Any] = {
            "echo": lambda r: self.spec.args[0], "sleep": lambda r: self.spec.args[0],
            "get_rank": lambda r: r, "_exit_on_rank": lambda r: r,
        }[self.spec.method]
        rank = self.spec.unique_reply_rank
        return per_rank(rank) if rank is not None else [per_rank(r) for r in range(WORLD_SIZE)]


@dataclasses.dataclass
class ExecutorModel:
    """What must be true: per-rank backlog, stopped ranks, faults, and every call made."""

    busy_until: list[float] = dataclasses.field(default_factory=lambda: [0.0] * WORLD_SIZE)
    stopped: dict[int, float] = dataclasses.field(default_factory=dict)  # rank -> SIGSTOP time
    fault_at: float | None = None  # first fatal fault (worker killed or crashed)
    shut_at: float | None = None  # first shutdown()
    calls: list[ModelCall] = dataclasses.field(default_factory=list)
    settled_upto: int = 0  # calls below this index are certainly resolved (result() drained them)
    slack_s: float = SLACK_S

    @property
    def failed_at(self) -> float | None:
        times = [t for t in (self.fault_at, self.shut_at) if t is not None]
        return min(times) if times else None

    def admit(self, spec: CallSpec, now: float) -> float:
        """Account for the work of a new call; return when it must be resolved by."""
        seconds = float(spec.args[0]) if spec.method == "sleep" else 0.0
        for r in range(WORLD_SIZE):  # every rank runs a broadcast call, even with one replier
            self.busy_until[r] = max(self.busy_until[r], now) + seconds
        done = _INF if self.stopped else max(self.busy_until)
        deadline = _INF if spec.timeout is None else now + spec.timeout
        return min(deadline, done)

    def resume(self, rank: int, now: float) -> None:
        """A stopped rank's backlog slides by how long it was stopped (an upper bound)."""
        stopped_at = self.stopped.pop(rank)
        self.busy_until[rank] = max(self.busy_until[rank], stopped_at) + (now - stopped_at)

    def unresolved_without_deadline(self) -> bool:
        """A future without a deadline that may still be pending (model knowledge only, so
        that preconditions never depend on timing: Hypothesis needs them deterministic)."""
        return any(c.spec.timeout is None and c.future is not None
                   for c in self.calls[self.settled_upto:])

    def drain_bound(self, index: int, now: float) -> float:
        """When ``result()`` of call ``index`` must return: it drains every earlier call."""
        if self.failed_at is not None:
            return now + self.slack_s
        bounds = [c.bound for c in self.calls[: index + 1] if c.ended is None]
        return max([now, *bounds]) + self.slack_s


def judge(call: ModelCall, failed_at: float | None) -> str | None:
    """Why ``call``'s outcome breaks the contract, or None when it is allowed."""
    spec, error = call.spec, call.error
    if error is None:
        if spec.method == "fail":
            return f"{call!r} returned {call.value!r} instead of raising WorkerError"
        if call.value != call.expected():
            return f"{call!r} got {call.value!r}, expected its own result {call.expected()!r}"
        return None
    assert call.ended is not None
    if isinstance(error, WorkerError):
        if spec.method == "fail" and error.exc_message == spec.args[0]:
            return None
        return f"{call!r} raised {type(error).__name__} not its own: {error.exc_message!r}"
    if isinstance(error, TimeoutError):
        if spec.timeout is None:
            return f"{call!r} has no deadline but raised {type(error).__name__}: {error}"
        if call.ended < call.deadline - EPS_S:
            early = call.deadline - call.ended
            return f"{call!r} raised {type(error).__name__} {early:.3f} s before its deadline"
        return None
    if isinstance(error, ExecutorFailedError):
        if failed_at is None or call.ended < failed_at:
            return f"{call!r} raised ExecutorFailedError with no fault and no shutdown: {error}"
        return None
    return f"{call!r} raised undocumented {type(error).__name__}: {error}"


class ExecutorMachine(RuleBasedStateMachine):
    """Drives ``executor_class`` with 2 EchoWorkers; see the module docstring."""

    executor_class: type[MultiprocExecutor] = MultiprocExecutor
    start_method = "fork"
    shutdown_grace = 0.3
    sigterm_grace = 0.3
    slack_s = SLACK_S
    detect_s = DETECT_S

    futures = Bundle("futures")

    def __init__(self) -> None:
        super().__init__()
        self.model = ExecutorModel(slack_s=self.slack_s)
        self._shm_before = _our_segments()
        self._lock = threading.Lock()  # guards seq and the resolution fields of calls
        self._seq = itertools.count()
        self._stuck: list[threading.Thread] = []
        self.callback_times: list[float] = []
        self._callback_ran = threading.Event()
        _no_threads_left_behind()  # fork must not copy a thread stuck in an earlier executor
        self.ex = self.executor_class(ExecutorConfig(
            tensor_parallel_size=WORLD_SIZE, start_method=self.start_method,
            shutdown_grace=self.shutdown_grace, sigterm_grace=self.sigterm_grace,
            startup_timeout=STARTUP_S))
        self.pids = list(self.ex.worker_pids)
        self.ex.register_failure_callback(self._on_failure)

    # ------------------------------------------------------------------ calls

    @rule(target=futures, spec=rpc_calls(WORLD_SIZE, timeouts=_DEADLINES))
    def call(self, spec: CallSpec) -> Any:
        """A call with a deadline, blocking or not: it ends by deadline + slack, whatever happens."""
        return self._submit(spec) if spec.non_block else self._blocking(spec)

    @precondition(lambda self: not self.model.stopped)
    @rule(target=futures, spec=rpc_calls(WORLD_SIZE, timeouts=(None,)))
    def call_without_deadline(self, spec: CallSpec) -> Any:
        """A call without a deadline (never while a worker is stopped: it would wait for it)."""
        return self._submit(spec) if spec.non_block else self._blocking(spec)

    @rule(target=futures, seconds=st.sampled_from([0.1, 0.3]), non_block=st.booleans())
    def slow_call(self, seconds: float, non_block: bool) -> Any:
        """A worker slower than the deadline (``sleep`` past 0.05 s): TimeoutError at the
        deadline, and its late replies must never reach a later call."""
        spec = CallSpec("sleep", (seconds,), 0.05, non_block)
        return self._submit(spec) if non_block else self._blocking(spec)

    @rule(call=consumes(futures))
    def result(self, call: ModelCall) -> None:
        """``result()`` in any order: drains every earlier call, ends by the latest bound."""
        if call.future is not None:  # else collective_rpc itself raised: nothing to wait for
            bound = self.model.drain_bound(call.index, time.monotonic())
            self._run_bounded(f"{call!r}.result()", call.future.result, bound)  # outcome: callback
        self.model.settled_upto = max(self.model.settled_upto, call.index + 1)
        late = [c for c in self.model.calls[: call.index] if c.future is not None and not c.future.done()]
        assert not late, f"{call!r}.result() returned but earlier calls are not done: {late}"
        self._judge_resolved()

    # ------------------------------------------------------------------ faults

    @precondition(lambda self: self.model.failed_at is None)
    @rule(rank=st.integers(0, WORLD_SIZE - 1), sig=st.sampled_from(["SIGKILL", "SIGTERM"]))
    def kill(self, rank: int, sig: str) -> None:
        """Kill a worker from outside (a SIGTERMed stopped worker is also sent SIGCONT)."""
        self.model.fault_at = time.monotonic()
        os.kill(self.pids[rank], getattr(signal, sig))
        if rank in self.model.stopped and sig == "SIGTERM":
            os.kill(self.pids[rank], signal.SIGCONT)
        self._check_death_detected(f"{sig} of rank {rank} (pid {self.pids[rank]})")

    @precondition(lambda self: self.model.failed_at is None and not self.model.stopped)
    @rule(rank=st.integers(0, WORLD_SIZE - 1), code=st.sampled_from([7, 0]))
    def crash_during_call(self, rank: int, code: int) -> None:
        """A blocking call whose method ``os._exit``s on one rank: ExecutorFailedError at once."""
        spec = CallSpec("_exit_on_rank", (rank, code))
        self.model.fault_at = time.monotonic()
        call = self._record(spec)
        bound = self.model.drain_bound(call.index, call.submitted) + self.detect_s
        crash = lambda: self.ex.collective_rpc(_exit_on_rank, args=(rank, code))  # noqa: E731
        self._finish(call, *self._run_bounded(repr(call), crash, bound))
        outcome = repr(call.error) if call.error is not None else f"the value {call.value!r}"
        assert isinstance(call.error, ExecutorFailedError), (
            f"{call!r}: rank {rank} exited with {code} mid-call, yet the call ended in "
            f"{outcome} instead of ExecutorFailedError")
        self._check_death_detected(f"os._exit({code}) of rank {rank} inside a call")

    @precondition(lambda self: self.model.failed_at is None
                  and not self.model.unresolved_without_deadline())
    @rule(rank=st.integers(0, WORLD_SIZE - 1))
    def stop(self, rank: int) -> None:
        """SIGSTOP a worker (a hang): calls with deadlines time out, nothing fails."""
        if rank not in self.model.stopped:
            self.model.stopped[rank] = time.monotonic()
            os.kill(self.pids[rank], signal.SIGSTOP)

    @precondition(lambda self: bool(self.model.stopped))
    @rule(rank=st.integers(0, WORLD_SIZE - 1))
    def resume(self, rank: int) -> None:
        """SIGCONT a worker (harmless if it was not stopped); its backlog resumes."""
        _signal(self.pids[rank], signal.SIGCONT)
        if rank in self.model.stopped:
            self.model.resume(rank, time.monotonic())

    @precondition(lambda self: self.model.shut_at is None and len(self.model.calls) >= 2)
    @rule()
    def shutdown(self) -> None:
        """shutdown(): bounded, resolves every future, leaves no worker (teardown calls it again)."""
        self.model.shut_at = time.monotonic()
        bound = time.monotonic() + self.shutdown_grace + self.sigterm_grace + 2 * self.slack_s
        _, error, _ = self._run_bounded("shutdown()", self.ex.shutdown, bound)
        assert error is None, f"shutdown() raised {type(error).__name__}: {error}"
        pending = [c for c in self.model.calls if c.future is not None and not c.future.done()]
        assert not pending, f"shutdown() returned but futures are unresolved: {pending}"
        alive = [p for p in self.pids if _alive(p)]
        assert not alive, f"shutdown() returned but worker pids {alive} are alive"
        assert self.ex.is_failed, "is_failed is False after shutdown()"
        self.model.stopped.clear()
        self._judge_resolved()

    # ------------------------------------------------------------------ invariants

    @invariant()
    def outcomes_are_allowed(self) -> None:
        self._judge_resolved()

    @invariant()
    def resolved_in_submission_order(self) -> None:
        with self._lock:
            seen = [c for c in self.model.calls
                    if c.seq is not None and not isinstance(c.error, TimeoutError)]
        for earlier, later in itertools.pairwise(seen):
            assert earlier.seq is not None and later.seq is not None
            assert earlier.seq < later.seq, (
                f"{later!r} resolved before {earlier!r}, which was submitted first")

    @invariant()
    def failure_only_after_a_fault(self) -> None:
        n = len(self.callback_times)
        assert n <= 1, f"the failure callback ran {n} times"
        if self.model.fault_at is None:
            assert n == 0, "the failure callback ran although no worker was harmed"
        if self.model.failed_at is None:
            assert not self.ex.is_failed, "the executor failed although no fault was injected"

    # ------------------------------------------------------------------ teardown

    def teardown(self) -> None:
        """Always: shut down, kill what is left (stopped workers too), join our threads."""
        ex = getattr(self, "ex", None)
        if ex is None:
            return
        problems: list[str] = []
        done = threading.Thread(target=ex.shutdown, name="machine-shutdown", daemon=True)
        done.start()
        done.join(self.shutdown_grace + self.sigterm_grace + 10.0)
        if done.is_alive():
            problems.append("shutdown() in teardown did not return; threads:\n" + _thread_stacks())
        elif self.model.shut_at is None:  # returned (the shutdown rule judged its own run):
            # no worker may be left; a shutdown that never SIGKILLs returns early without error
            alive = [p for p in self.pids if _alive(p)]
            if alive:
                problems.append(f"shutdown() in teardown returned but worker pids {alive} are alive")
        for pid in self.pids:
            _signal(pid, signal.SIGKILL)  # a no-op unless something survived
        for t in [*self._stuck, done]:
            t.join(10.0)
        leftovers = [p for p in self.pids if _wait_gone(p, 5.0)]
        problems += [f"worker pid {p} outlived teardown" for p in leftovers]
        problems += [f"/dev/shm/{n} outlived teardown" for n in sorted(_our_segments() - self._shm_before)]
        assert not problems, "; ".join(problems)

    # ------------------------------------------------------------------ helpers

    def _record(self, spec: CallSpec) -> ModelCall:
        index = len(self.model.calls)
        spec = dataclasses.replace(spec, args=unique_args(spec, index))
        now = time.monotonic()
        call = ModelCall(index, spec, now, self.model.admit(spec, now))
        self.model.calls.append(call)
        return call

    def _invoke(self, spec: CallSpec) -> Any:
        return self.ex.collective_rpc(spec.method, timeout=spec.timeout, args=spec.args,
                                      non_block=spec.non_block, unique_reply_rank=spec.unique_reply_rank)

    def _blocking(self, spec: CallSpec) -> Any:
        call = self._record(spec)
        if spec.timeout is not None:
            bound = call.deadline + self.slack_s  # its own deadline bounds draining earlier calls too
        else:
            bound = self.model.drain_bound(call.index, call.submitted)
        self._finish(call, *self._run_bounded(repr(call), lambda: self._invoke(call.spec), bound))
        if spec.timeout is None:  # it waited for every earlier call
            self.model.settled_upto = call.index + 1
        self._judge_resolved()
        return multiple()  # nothing to wait for later

    def _submit(self, spec: CallSpec) -> Any:
        call = self._record(spec)
        if call.deadline < _INF:
            bound = call.deadline + self.slack_s  # the enqueue honours the deadline
        else:  # the ring may be full of queued sleeps: the enqueue waits for the backlog
            bound = max(call.submitted, *self.model.busy_until) + self.slack_s
        future, error, ended = self._run_bounded(f"submit {call!r}", lambda: self._invoke(call.spec), bound)
        if error is not None or not isinstance(future, Future):  # the call ended right there
            self._finish(call, future, error, ended)
            self._judge_resolved()
            return call  # still bundled: what the bundle holds must not depend on timing
        call.future = future
        future.add_done_callback(functools.partial(self._resolved, call))
        return call

    def _run_bounded(self, what: str, fn: Callable[[], Any],
                     bound: float) -> tuple[Any, BaseException | None, float]:
        """Run ``fn`` in a helper thread: (value, error, end time); fail if it passes ``bound``."""
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["value"] = fn()
            except BaseException as exc:  # noqa: BLE001 - returned to the caller, never lost
                box["error"] = exc
            box["ended"] = time.monotonic()

        t = threading.Thread(target=run, name="machine-call", daemon=True)
        t.start()
        t.join(max(0.0, bound - time.monotonic()))
        if t.is_alive():
            self._stuck.append(t)
            raise AssertionError(f"{what} had not returned by its bound (a hang)")
        error = box.get("error")
        if error is not None and not isinstance(error, Exception):
            raise AssertionError(f"{what} let {type(error).__name__} escape into the caller") from error
        return box.get("value"), error, box["ended"]

    def _finish(self, call: ModelCall, value: Any, error: BaseException | None,
                ended: float | None = None) -> None:
        with self._lock:
            if call.seq is None:
                call.ended, call.seq = ended or time.monotonic(), next(self._seq)
                call.value, call.error = value, error

    def _resolved(self, call: ModelCall, future: Future[Any]) -> None:
        error = future.exception(timeout=0)
        self._finish(call, None if error is not None else future.result(timeout=0), error)

    def _judge_resolved(self) -> None:
        failed_at = self.model.failed_at
        with self._lock:
            fresh = [c for c in self.model.calls if c.seq is not None and not c.judged]
        for call in fresh:
            call.judged = True
            problem = judge(call, failed_at)
            assert problem is None, problem

    def _on_failure(self) -> None:
        self.callback_times.append(time.monotonic())
        self._callback_ran.set()

    def _check_death_detected(self, what: str) -> None:
        """In-flight futures fail, and the callback runs once, within detect_s of the fault."""
        assert self.model.fault_at is not None
        bound = self.model.fault_at + self.detect_s
        in_flight = [c.future for c in self.model.calls if c.future is not None]
        wait_futures(in_flight, timeout=max(0.0, bound - time.monotonic()))
        late = [c for c in self.model.calls if c.future is not None and not c.future.done()]
        assert not late, f"{what}: calls in flight still unresolved after {self.detect_s:g} s: {late}"
        grace = self.shutdown_grace + self.sigterm_grace  # stopped workers delay the callback
        ran = self._callback_ran.wait(max(0.0, bound + grace - time.monotonic()))
        assert ran, f"{what}: the failure callback did not run within {self.detect_s + grace:g} s"
        assert self.ex.is_failed, f"{what}: is_failed is False after the failure callback"
        self._judge_resolved()


def _no_threads_left_behind(within_s: float = 10.0) -> None:
    """Wait for the threads of earlier examples (calls, executor threads) to end."""
    deadline = time.monotonic() + within_s
    while True:
        left = [t for t in threading.enumerate() if t.name.startswith(("machine-", "faultlab-"))]
        if not left:
            return
        if time.monotonic() >= deadline:
            raise AssertionError(f"threads of an earlier example are still running: "
                                 f"{[t.name for t in left]}\n{_thread_stacks()}")
        left[0].join(0.05)


def _thread_stacks() -> str:
    frames = sys._current_frames()
    return "\n".join(f"--- {t.name}\n" + "".join(traceback.format_stack(frames[t.ident])[-6:])
                     for t in threading.enumerate() if t.ident in frames)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _alive(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def _wait_gone(pid: int, within_s: float) -> bool:
    """True if ``pid`` is still alive after ``within_s``."""
    try:
        psutil.Process(pid).wait(within_s)
    except psutil.NoSuchProcess:
        return False
    except psutil.TimeoutExpired:
        return _alive(pid)
    return False


def _our_segments() -> set[str]:
    return resources.shm_names(owner=os.getpid())
