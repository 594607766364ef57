"""Races and limits of the executor's lifecycle that bind (issue 31, part 4), each with a
case that must fire and one that must stay quiet, and each case shown to fail on a planted
bug (chaos/planted_judges/lifecycle.py).

    race / limit                          fire                          quiet
    1 a call while another thread fails   refused at once, after every  a call whose replies were
      the executor                        earlier future; a callback    in keeps its result; the
                                          registered mid-failure: once  failure runs callbacks once
      ... and a restart meanwhile         goes live only once that      (test_executor_restart:
                                          failure is handled in full    restart after a handled one)
    2 shutdown() while a restart swaps    shutdown wins: the restart    a call racing the swap is
      in its new incarnation              raises, its workers are gone  refused; the restart serves
    3 callback registered while failed,   it runs at once and again at  restart then shutdown: it
      restart, second failure             the second failure            ran once, never again
    4 an old incarnation's death report   a death of the new one fails  the old one's late report
      arriving after the swap             it, named (rank, pid, signal) leaves the new one serving
    5 start-up / back-off longer than     both end at the restart's     a back-off longer than the
      what is left of the deadline        deadline                      deadline: first attempt ok
    6 who ends a worker in an orderly     the driver's SIGTERM after    workers that leave on EOF
      shutdown                            its grace; never the guard    get no escalation at all

Races are made deterministic with hand-offs, never sleeps: failpoints (driver.before_settle,
driver.before_go_live, worker.death_pipe), a log handler that holds the failing thread
inside ``_fail``, a death report held back and delivered after the swap.  Bounds on time
are only ever "much less than the planted delay" (a loaded machine cannot turn a pass into a
failure).  Every case uses the fork start method: the exit guard's plant must reach the
workers, which inherit the driver's (planted) modules only through fork.

``CATCHERS`` maps every plant to the cases that must fail under it; each case is the
catcher of at least one plant.  The Ray cases are outside the default run, like
tests/executor_tests/test_executor_ray_faults.py (FAULTLAB_RAY_CHECKS=1):

    4 on Ray: an old group's report after the swap is dropped (quiet), a death in the new
      group fails it (fire);
    a new actor killed after READY, before the swap: the restart finds it and retries (it
      served before: RayExecutor had no look after the swap, which multiproc has).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import leaks
import psutil
import pytest

from chaos.planted_judges import PlantedJudge, planted_in
from executor import ExecutorConfig, ExecutorFailedError, MultiprocExecutor, failpoints
from executor.errors import RestartAborted

Make = Callable[..., Any]
Case = Callable[[Make, Path], None]
BOUND_S = 10.0  # how long a hand-off may take on a loaded machine (only a broken run waits)
STALL_S = 6.0  # a planted delay: start-up and back-off of the deadline cases (limit 3.75)
RAY = os.environ.get("FAULTLAB_RAY_CHECKS") == "1"


# ---------------------------------------------------------------------------- helpers


class _Executors:
    """Makes fork executors (tp 2) and shuts every one down on ``close``."""

    def __init__(self) -> None:
        self.made: list[Any] = []

    def __call__(self, **overrides: Any) -> MultiprocExecutor:
        fields = {"tensor_parallel_size": 2, "start_method": "fork", **overrides}
        ex = MultiprocExecutor(ExecutorConfig(**fields))
        self.made.append(ex)
        return ex

    def close(self) -> None:
        for ex in self.made:
            ex.shutdown()


@pytest.fixture
def make() -> Iterator[_Executors]:
    executors = _Executors()
    try:
        yield executors
    finally:
        executors.close()


def _wait(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + BOUND_S
    while not predicate():
        assert time.monotonic() < deadline, f"not within {BOUND_S:g} s: {what}"
        time.sleep(0.01)


def _gone(pids: list[int]) -> bool:
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            pass
    return True


class _Counter:
    """A failure callback: records ``ex.incarnation`` at each run; ``runs(n)`` waits for n."""

    def __init__(self, ex: Any) -> None:
        self.ex = ex
        self.seen: list[int] = []
        self._changed = threading.Condition()

    def __call__(self) -> None:
        with self._changed:
            self.seen.append(self.ex.incarnation)
            self._changed.notify_all()

    def runs(self, n: int) -> list[int]:
        with self._changed:
            assert self._changed.wait_for(lambda: len(self.seen) >= n, BOUND_S), \
                f"the callback ran {len(self.seen)} time(s), not {n}"
            return list(self.seen)


class _HoldFailure(logging.Handler):
    """Holds the thread that fails the executor inside ``_fail``: after the failure is
    marked (``_failure`` set), before any pending call is failed or a callback run."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.holding = threading.Event()
        self.go = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("executor failed") and not self.holding.is_set():
            self.holding.set()
            self.go.wait(BOUND_S)


class _Steps(logging.Handler):
    """The escalation steps shutdown took: ("SIGTERM", ranks), ("SIGKILL", ranks)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.steps: list[tuple[str, list[int]]] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.msg == "executor shutdown: %s to worker rank(s) %s":
            step, ranks = record.args  # type: ignore[misc]
            self.steps.append((str(step), list(ranks)))


def _with_handler(handler: logging.Handler) -> Callable[[], None]:
    logger = logging.getLogger("executor")
    level = logger.level
    if not logger.isEnabledFor(handler.level):
        logger.setLevel(handler.level)
    logger.addHandler(handler)

    def remove() -> None:
        logger.removeHandler(handler)
        logger.setLevel(level)
    return remove


# Run in the workers (the fork start method pickles them by reference to this module).

def _stall_death_pipe(worker: object) -> None:
    """The worker's death-pipe watcher thread never acts: only signals can end it."""
    failpoints.enable("worker.death_pipe", lambda **_: time.sleep(60))


def _mark_sigterm_then_sleep(worker: Any, directory: str, seconds: float,
                             linger: float = 0.0) -> None:
    """Leave a file when SIGTERM arrives (then take ``linger`` s to leave, as a worker
    cleaning up would), say so once sleeping, then sleep."""
    previous = signal.getsignal(signal.SIGTERM)
    marker = os.path.join(directory, f"sigterm-{worker.rank}")

    def on_sigterm(signum: int, frame: Any) -> None:
        with open(marker, "w"):
            pass
        time.sleep(linger)
        if callable(previous):
            previous(signum, frame)

    signal.signal(signal.SIGTERM, on_sigterm)
    with open(os.path.join(directory, f"sleeping-{worker.rank}"), "w"):
        pass
    time.sleep(seconds)


def _sleeping(directory: Path, ranks: int = 2) -> Callable[[], bool]:
    return lambda: all((directory / f"sleeping-{r}").exists() for r in range(ranks))


# ---------------------------------------------------------------------------- 1: a call while failing


def race1_fire(make: Make, tmp: Path) -> None:
    """The monitor thread is held inside ``_fail`` (failed, nothing failed yet): a call made
    now is refused at once and only after the earlier future failed; a callback registered
    now runs exactly once, like the one registered before."""
    ex = make()
    early = _Counter(ex)
    ex.register_failure_callback(early)
    earlier = ex.collective_rpc("sleep", args=(30,), timeout=60, non_block=True)
    hold = _HoldFailure()
    remove = _with_handler(hold)
    try:
        os.kill(ex.worker_pids[1], signal.SIGKILL)
        assert hold.holding.wait(BOUND_S), "the worker's death was never reported"
        with pytest.raises(ExecutorFailedError, match="rank 1"):
            ex.collective_rpc("echo", args=(1,), timeout=BOUND_S)
        assert earlier.done(), "a refused call raised before an earlier future failed"
        assert isinstance(earlier.exception(0), ExecutorFailedError)
        late = _Counter(ex)
        ex.register_failure_callback(late)  # mid-failure: the callbacks have not run yet
    finally:
        hold.go.set()
        remove()
    early.runs(1)
    late.runs(1)
    ex.shutdown()
    assert early.seen == [0] and late.seen == [0], "a failure callback ran twice"


def race1_quiet(make: Make, tmp: Path) -> None:
    """The failure lands while a future whose replies were all in is being settled: it keeps
    its result; the failure still runs the callback once."""
    ex = make()
    callback = _Counter(ex)
    ex.register_failure_callback(callback)
    future = ex.collective_rpc("echo", args=("kept",), non_block=True)
    fired: list[int] = []

    def fail_now(**_: Any) -> None:
        if not fired:
            fired.append(1)
            os.kill(ex.worker_pids[1], signal.SIGKILL)
            callback.runs(1)  # the failure was handled in full, callbacks included

    failpoints.enable("driver.before_settle", fail_now)
    try:
        outcome = future.exception(timeout=BOUND_S * 3)
    finally:
        failpoints.disable("driver.before_settle")
    assert outcome is None, f"a call whose replies were all in was failed: {outcome}"
    assert future.result(0) == ["kept", "kept"]
    assert fired and ex.is_failed and callback.seen == [0]


class _TellOnWait:
    """Stands in for ``ex._failure_handled``: says when a restart starts waiting on it."""

    def __init__(self, event: threading.Event, told: Callable[[], None]) -> None:
        self.event, self.told = event, told

    def is_set(self) -> bool:
        return self.event.is_set()

    def set(self) -> None:
        self.event.set()

    def wait(self, timeout: float | None = None) -> bool:
        self.told()
        return self.event.wait(timeout)


def race1_restart(make: Make, tmp: Path) -> None:
    """restart() while the monitor thread is still failing the old incarnation (held inside
    ``_fail``, for longer than the resources' own 5 s join of it unless the restart waits):
    the new incarnation goes live only once that failure is handled in full, is never
    stopped by it, and the callbacks ran once, for incarnation 0.  (Found by this case: the
    late failure used to stop the new workers and leave the executor un-failed.)"""
    ex = make()
    callback = _Counter(ex)
    ex.register_failure_callback(callback)
    hold = _HoldFailure()
    remove = _with_handler(hold)
    live: list[bool] = []
    errors: list[BaseException] = []

    def go_live(resources: Any, incarnation: int) -> None:
        live.append(hold.go.is_set() and handled.is_set())
        hold.go.set()  # a broken restart got here first: let the held failure go on

    def restart() -> None:
        try:
            ex.restart("while the old failure is handled")
        except BaseException as exc:  # noqa: BLE001 - inspected below
            errors.append(exc)

    failpoints.enable("driver.before_go_live", go_live)
    restarting = threading.Thread(target=restart, name="test-restart")
    try:
        os.kill(ex.worker_pids[1], signal.SIGKILL)
        assert hold.holding.wait(BOUND_S), "the worker's death was never reported"
        handled = ex._failure_handled
        ex._failure_handled = _TellOnWait(handled, hold.go.set)  # the restart waiting lets it go
        restarting.start()
        restarting.join(BOUND_S * 3)
    finally:
        hold.go.set()
        failpoints.disable("driver.before_go_live")
        remove()
        if restarting.ident is not None:
            restarting.join(BOUND_S * 3)
    assert errors == [] and live == [True], \
        f"the new incarnation went live while the old failure was handled: {live} {errors}"
    assert ex.incarnation == 1 and not ex.is_failed
    assert ex.collective_rpc("echo", args=(8,), timeout=BOUND_S) == [8, 8]
    ex.check_health()
    ex.shutdown()
    assert callback.seen == [0]


# ---------------------------------------------------------------------------- 2: shutdown vs swap


def race2_fire(make: Make, tmp: Path) -> None:
    """shutdown() arrives once the new workers said READY, before the swap: shutdown wins."""
    ex = make()
    old = ex.worker_pids
    callback = _Counter(ex)
    ex.register_failure_callback(callback)
    closing = threading.Thread(target=ex.shutdown, name="test-shutdown")
    new: list[int] = []

    def go_live(resources: Any, incarnation: int) -> None:
        new.extend(h.pid for h in resources.handles)
        closing.start()
        _wait(lambda: ex._closed, "shutdown() began")

    failpoints.enable("driver.before_go_live", go_live)
    try:
        with pytest.raises(RestartAborted, match="shut down"):
            ex.restart("racing shutdown")
    finally:
        failpoints.disable("driver.before_go_live")
        if closing.is_alive() or new:
            closing.join(BOUND_S * 3)
    assert not closing.is_alive(), "shutdown() did not return once the restart gave up"
    assert len(new) == 2 and ex.incarnation == 0 and ex.is_failed
    assert _gone(old) and _gone(new), "the aborted incarnation's workers outlived shutdown()"
    with pytest.raises(ExecutorFailedError, match="shut down"):
        ex.restart("again")
    with pytest.raises(ExecutorFailedError):
        ex.collective_rpc("echo", args=(1,), timeout=BOUND_S)
    assert callback.seen == [0]  # the restart's failure of incarnation 0; shutdown is none


def race2_quiet(make: Make, tmp: Path) -> None:
    """A call from another thread at the same instant is refused at once (nothing waits on
    the half-started incarnation) and the restart goes live."""
    ex = make()
    callback = _Counter(ex)
    ex.register_failure_callback(callback)
    outcomes: list[object] = []

    def call() -> None:
        try:
            outcomes.append(ex.collective_rpc("echo", args=(1,), timeout=BOUND_S))
        except ExecutorFailedError as exc:
            outcomes.append(exc)

    def go_live(resources: Any, incarnation: int) -> None:
        caller = threading.Thread(target=call, name="test-caller")
        caller.start()
        caller.join(BOUND_S * 2)

    failpoints.enable("driver.before_go_live", go_live)
    try:
        ex.restart("racing a call")
    finally:
        failpoints.disable("driver.before_go_live")
    assert len(outcomes) == 1 and isinstance(outcomes[0], ExecutorFailedError), \
        f"a call before the swap reached the new incarnation: {outcomes}"
    assert ex.incarnation == 1 and not ex.is_failed
    assert ex.collective_rpc("echo", args=(2,), timeout=BOUND_S) == [2, 2]
    ex.shutdown()
    assert callback.seen == [0]


# ---------------------------------------------------------------------------- 3: late callback, restart


def _fail_and_register_late(ex: Any) -> tuple[_Counter, _Counter]:
    early = _Counter(ex)
    ex.register_failure_callback(early)
    os.kill(ex.worker_pids[0], signal.SIGKILL)
    early.runs(1)
    late = _Counter(ex)
    ex.register_failure_callback(late)
    assert late.seen == [0], "a callback registered on a failed executor did not run at once"
    ex.restart("after the first failure")
    return early, late


def race3_fire(make: Make, tmp: Path) -> None:
    """Registered while failed, then a restart, then a second failure: it runs again."""
    ex = make()
    early, late = _fail_and_register_late(ex)
    os.kill(ex.worker_pids[1], signal.SIGKILL)
    _wait(lambda: ex.is_failed, "the second death was seen")
    ex.shutdown()  # joins the thread that failed it, and so its callbacks
    assert early.seen == [0, 1] and late.seen == [0, 1], "the second failure ran no callback"


def race3_quiet(make: Make, tmp: Path) -> None:
    """Registered while failed, then a restart, then shutdown: it ran once, at registration."""
    ex = make()
    early, late = _fail_and_register_late(ex)
    assert ex.collective_rpc("echo", args=(3,), timeout=BOUND_S) == [3, 3]
    ex.shutdown()
    after = _Counter(ex)
    ex.register_failure_callback(after)
    assert early.seen == [0] and late.seen == [0] and after.seen == []


# ---------------------------------------------------------------------------- 4: late death reports


def race4_fire(make: Make, tmp: Path) -> None:
    """After a restart, a death of the new incarnation fails it, named, callbacks once more."""
    ex = make()
    callback = _Counter(ex)
    ex.register_failure_callback(callback)
    os.kill(ex.worker_pids[0], signal.SIGKILL)
    callback.runs(1)
    ex.restart("after a death")
    victim = ex.worker_pids[1]
    os.kill(victim, signal.SIGKILL)
    with pytest.raises(ExecutorFailedError) as info:
        ex.collective_rpc("sleep", args=(30,), timeout=BOUND_S * 3)
    error = info.value
    assert (error.rank, error.pid, error.exitcode) == (1, victim, -signal.SIGKILL), str(error)
    assert "killed by SIGKILL" in str(error)
    assert callback.runs(2) == [0, 1]


def race4_quiet(make: Make, tmp: Path) -> None:
    """The old incarnation's monitor reports a death that arrives after the swap (held back,
    then delivered as it was made): the new incarnation keeps serving."""
    ex = make()
    callback = _Counter(ex)
    ex.register_failure_callback(callback)
    monitor = ex._res.monitor
    report = monitor._on_death
    held: list[tuple[Any, ...]] = []
    monitor._on_death = lambda *args: held.append(args)
    old = ex.worker_pids
    os.kill(old[1], signal.SIGKILL)
    _wait(lambda: bool(held), "the old monitor reported the death")
    monitor.join(BOUND_S)
    ex.restart("a worker died")
    assert callback.seen == [0] and ex.incarnation == 1
    assert held[0][:2] == (1, old[1])
    report(*held[0])  # late: the old incarnation's report, after the swap
    assert not ex.is_failed, "an old incarnation's death report failed the new one"
    assert ex.collective_rpc("echo", args=(4,), timeout=BOUND_S) == [4, 4]
    ex.check_health()
    assert callback.seen == [0]


# ---------------------------------------------------------------------------- 5: deadline limits


class _TimedStarts:
    """Wraps ``ex.start_incarnation``: the (start, end) of every attempt."""

    def __init__(self, ex: Any) -> None:
        self.spans: list[tuple[float, float]] = []
        self._start = ex.start_incarnation
        ex.start_incarnation = self

    def __call__(self, startup_timeout: float) -> None:
        began = time.monotonic()
        try:
            self._start(startup_timeout)
        finally:
            self.spans.append((began, time.monotonic()))


def race5_fire(make: Make, tmp: Path) -> None:
    """restart_timeout 1 s; start-up and back-off STALL_S each: the hung attempt gets what
    is left (about 1 s), and the back-off after it what is left then (nothing)."""
    flag = tmp / "hang"
    ex = make(worker="restart_helpers:FlagHangWorker", worker_kwargs={"fail_flag": str(flag)},
              restart_budget=5, restart_timeout=1.0, startup_timeout=STALL_S,
              restart_backoff=STALL_S, restart_backoff_max=STALL_S,
              shutdown_grace=0.5, sigterm_grace=0.5)
    flag.touch()
    starts = _TimedStarts(ex)
    with pytest.raises(ExecutorFailedError, match=r"restart_timeout=1 s \(1 attempt"):
        ex.restart("hung incarnations")
    ended = time.monotonic()
    assert len(starts.spans) == 1 and ex.restarts_used == 1 and ex.is_failed
    began, stopped = starts.spans[0]
    limit = STALL_S * 5 / 8
    assert stopped - began < limit, f"the start-up took {stopped - began:.1f} s (deadline 1 s)"
    assert ended - stopped < limit, f"the back-off took {ended - stopped:.1f} s (deadline 1 s)"


def race5_quiet(make: Make, tmp: Path) -> None:
    """A back-off (and start-up timeout) far longer than restart_timeout: the first attempt
    needs none of it and succeeds."""
    ex = make(restart_timeout=STALL_S * 5 / 8, restart_backoff=60.0, restart_backoff_max=60.0)
    os.kill(ex.worker_pids[0], signal.SIGKILL)
    _wait(lambda: ex.is_failed, "the death was seen")
    ex.restart("a worker died")
    assert ex.restarts_used == 1 and ex.incarnation == 1
    assert ex.collective_rpc("echo", args=(5,), timeout=BOUND_S) == [5, 5]


# ---------------------------------------------------------------------------- 6: who ends a worker


def race6_fire(make: Make, tmp: Path) -> None:
    """Workers whose death-pipe watcher is stuck, sleeping: shutdown's own SIGTERM, after its
    grace, ends them; the exit guard (driver alive) never does, and nothing needs SIGKILL."""
    ex = make(shutdown_grace=2.0, sigterm_grace=BOUND_S)
    ex.collective_rpc(_stall_death_pipe, timeout=BOUND_S)
    future = ex.collective_rpc(_mark_sigterm_then_sleep, args=(str(tmp), 60), non_block=True)
    _wait(_sleeping(tmp), "both workers sleep")
    steps = _Steps()
    remove = _with_handler(steps)
    try:
        ex.shutdown()
    finally:
        remove()
    assert steps.steps == [("SIGTERM", [0, 1])], steps.steps
    assert all((tmp / f"sigterm-{r}").exists() for r in range(2)), \
        "a worker ended before the driver's SIGTERM (the exit guard's SIGKILL?)"
    assert isinstance(future.exception(0), ExecutorFailedError)


def race6_quiet(make: Make, tmp: Path) -> None:
    """Workers that leave on the death pipe's EOF (sleeping too, then half a second of
    clean-up, well within the grace): no escalation at all."""
    ex = make(shutdown_grace=BOUND_S, worker_exit_grace=2.0)
    ex.collective_rpc(_mark_sigterm_then_sleep, args=(str(tmp), 60, 0.5), non_block=True)
    _wait(_sleeping(tmp), "both workers sleep")
    steps = _Steps()
    remove = _with_handler(steps)
    try:
        ex.shutdown()
    finally:
        remove()
    assert steps.steps == [], steps.steps
    assert all((tmp / f"sigterm-{r}").exists() for r in range(2))  # their own, at EOF


# ---------------------------------------------------------------------------- Ray: an old group's report


class _RayExecutors(_Executors):
    """Makes RayExecutors (tp 2) on the session's cluster; ``close`` waits for the actors."""

    def __init__(self, address: str) -> None:
        super().__init__()
        self.address = address

    def __call__(self, **overrides: Any) -> Any:
        from executor import RayExecutor

        ex = RayExecutor(ExecutorConfig(tensor_parallel_size=2, **overrides), address=self.address)
        self.made.append(ex)
        return ex

    def close(self) -> None:
        pids = [pid for ex in self.made for pid in ex.worker_pids]
        super().close()
        assert leaks.wait_gone(pids, BOUND_S) == [], "actors outlived their executor's shutdown"


@pytest.fixture
def ray_make(ray_cluster: Any) -> Iterator[_RayExecutors]:
    executors = _RayExecutors(ray_cluster.address)
    try:
        yield executors
    finally:
        executors.close()


def ray_race4(make: Make, tmp: Path) -> None:
    """RayExecutor: the old group's death report, delivered after the swap as its monitor
    thread would, leaves the new group serving (quiet); a death in the new group fails the
    executor naming its rank, and the callback runs again (fire)."""
    ex = make()
    callback = _Counter(ex)
    ex.register_failure_callback(callback)
    old = ex._group
    ex.restart("a late report")
    assert callback.seen == [0] and ex.incarnation == 1
    ex._death(1, RuntimeError("the old actor died"), time.time_ns(), old)  # its monitor, late
    assert not ex.is_failed, "an old Ray group's death report failed the new group"
    assert ex.collective_rpc("echo", args=(6,), timeout=BOUND_S * 3) == [6, 6]
    os.kill(ex.worker_pids[1], signal.SIGKILL)
    with pytest.raises(ExecutorFailedError, match="rank 1"):
        ex.collective_rpc("sleep", args=(30,), timeout=BOUND_S * 6)
    assert callback.runs(2) == [0, 1]


def ray_early_death(make: Make, tmp: Path) -> None:
    """RayExecutor: a new actor dies once the group said READY, before the swap (its
    monitor's report finds the executor still failed and is dropped): the restart finds it
    right after the swap, as restart.py promises, and never serves with it."""
    ex = make()
    swap = ex._swap_in
    victims: list[int] = []

    def kill_first(send_lock: Any, reply_lock: Any) -> None:
        if not victims:
            victims.append(ex._group.pids[1])
            os.kill(victims[0], signal.SIGKILL)
            ex._monitor.join(BOUND_S * 3)  # its report came, and found the executor failed
            assert not ex._monitor.is_alive(), "the new group's monitor never saw the death"
        swap(send_lock, reply_lock)

    ex._swap_in = kill_first
    ex.restart("a death before the swap")
    assert victims and victims[0] not in ex.worker_pids, \
        f"rank 1 (pid {victims[0]}) died before the swap and serves: {ex.worker_pids}"
    assert ex.incarnation == 2 and ex.restarts_used == 2
    assert ex.collective_rpc("echo", args=(7,), timeout=BOUND_S * 3) == [7, 7]


@pytest.mark.skipif(not RAY, reason="Ray cluster case: set FAULTLAB_RAY_CHECKS=1 (slow)")
@pytest.mark.timeout(300)
def test_ray_old_group_report(ray_make: _RayExecutors, tmp_path: Path) -> None:
    ray_race4(ray_make, tmp_path)


@pytest.mark.skipif(not RAY, reason="Ray cluster case: set FAULTLAB_RAY_CHECKS=1 (slow)")
@pytest.mark.timeout(300)
def test_ray_death_before_the_swap(ray_make: _RayExecutors, tmp_path: Path) -> None:
    ray_early_death(ray_make, tmp_path)


# ---------------------------------------------------------------------------- the cases


CASES: tuple[Case, ...] = (race1_fire, race1_quiet, race1_restart, race2_fire, race2_quiet, race3_fire,
                           race3_quiet, race4_fire, race4_quiet, race5_fire, race5_quiet,
                           race6_fire, race6_quiet)

# Each plant, and the cases that must fail under it.
CATCHERS: dict[str, tuple[Case, ...]] = {
    "lifecycle_register_decides_by_failed": (race1_fire,),
    "lifecycle_register_while_failed_deferred": (race3_quiet,),
    "lifecycle_failure_overrides_resolved": (race1_quiet,),
    "lifecycle_restart_skips_failure_handling": (race1_restart,),
    "lifecycle_swap_ignores_shutdown": (race2_fire,),
    "lifecycle_swap_keeps_callbacks_ran": (race3_fire,),
    "lifecycle_failure_cleared_before_swap": (race2_quiet,),
    "lifecycle_death_report_by_rank": (race4_quiet,),
    "lifecycle_signal_death_as_exit_code": (race4_fire,),
    "lifecycle_startup_not_capped_by_deadline": (race5_fire,),
    "lifecycle_backoff_not_capped_by_deadline": (race5_fire,),
    "lifecycle_backoff_before_first_attempt": (race5_quiet,),
    "lifecycle_guard_ignores_driver": (race6_fire,),
    "lifecycle_escalation_without_grace": (race6_quiet,),
    "lifecycle_ray_death_any_group": (ray_race4,),
    "lifecycle_ray_early_death_unseen": (ray_early_death,),
}
RAY_CASES = (ray_race4, ray_early_death)
CAUGHT = (AssertionError, pytest.fail.Exception, ExecutorFailedError)  # a documented error


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.__name__)
def test_race(case: Case, make: _Executors, tmp_path: Path) -> None:
    case(make, tmp_path)


def test_every_plant_has_catchers_and_every_case_catches_one() -> None:
    names = [judge.name for judge in planted_in("lifecycle")]
    assert sorted(names) == sorted(CATCHERS)
    assert all(name.startswith("lifecycle_") for name in names)
    catching = {case for cases in CATCHERS.values() for case in cases}
    missing = [case.__name__ for case in (*CASES, *RAY_CASES) if case not in catching]
    assert not missing, f"cases that catch no plant: {missing}"


def _ray_plant(judge: PlantedJudge) -> Any:
    marks = [] if "ray" not in judge.name else [pytest.mark.skipif(
        not RAY, reason="Ray cluster case: set FAULTLAB_RAY_CHECKS=1 (slow)")]
    return pytest.param(judge, id=judge.name, marks=marks)


@pytest.mark.parametrize("judge", [_ray_plant(j) for j in planted_in("lifecycle")])
def test_plant_is_caught(judge: PlantedJudge, tmp_path: Path, request: Any) -> None:
    for case in CATCHERS[judge.name]:
        executors = request.getfixturevalue("ray_make") if case in RAY_CASES else _Executors()
        directory = tmp_path / case.__name__
        directory.mkdir()
        with judge.planted():
            try:
                case(executors, directory)
            except CAUGHT:
                continue
            finally:
                executors.close()
        pytest.fail(f"{judge.name} ({judge.bug}) escaped {case.__name__}")

