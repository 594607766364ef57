"""Planted bugs in the executor's lifecycle: failure state, callbacks, restart, exits.

The judges here are the executor's own decisions about its races and limits (issue 31,
part 4): who is failed, which callbacks run and how often, whether a restart may go live,
which death report counts, how long a restart may wait, who ends a worker at shutdown.

    plant (where)                                   planted bug
    lifecycle.ExecutorLifecycle
      .register_failure_callback                    "already failed" read from _failed, not
                                                    from whether the callbacks ran: one
                                                    registered mid-failure runs twice
      .register_failure_callback                    one registered on a failed executor is
                                                    only kept (runs at the next failure)
      ._fail_pending                                a failure also fails calls already
                                                    resolved whose futures are not settled
      ._swap_in                                     the swap ignores shutdown (no "shutdown
                                                    wins")
      ._swap_in                                     the swap keeps _callbacks_ran: the new
                                                    incarnation's failure runs no callback
      .wait_for_old_incarnation                     the failure is cleared once the old
                                                    incarnation is gone, before the swap
      ._wait_failure_handled                        a restart does not wait for the failure's
                                                    handling: a late one stops the new workers
                                                    (the bug this issue's case found and fixed)
    multiproc.MultiprocExecutor._on_worker_death    a report is matched by rank, not pid: an
                                                    old incarnation's late report fails the new
    multiproc.MultiprocExecutor.start_incarnation   start-up gets startup_timeout, not what is
                                                    left of the restart's deadline
    restart.pause_before                            back-off not capped by the deadline
    restart.pause_before                            back-off before the first attempt too
    exit_guard._watch                               the guard takes the death pipe's EOF for the
                                                    driver's death: SIGKILL while it lives
    stopping.stop_processes (as resources calls it) escalation without the graces
    exits._reap                                     a signal death reported as an exit code
    ray_executor.RayExecutor._death                 a death report not checked against the
                                                    current Ray group
    ray_executor.RayExecutor._report_early_death    an actor that died before the swap serves
                                                    (the bug this issue's case found and fixed)

Plants act in the driver process; the exit guard's runs in each worker's guard, so its
cases start workers with the fork start method (they inherit the planted module).  Their
cases, and which case must catch which plant: ``tests/executor_tests/
test_executor_lifecycle_races.py``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from chaos.planted_judges import PlantedJudge

Method = Callable[..., Any]


def _register_by_failed(original: Method) -> Method:
    from executor.lifecycle import _run_callback

    def register_failure_callback(self: Any, callback: Callable[[], None]) -> None:
        self._check_owner()
        with self._state_lock:
            failed = self._failed
            self._callbacks.append(callback)
        if failed:
            _run_callback(callback)
    return register_failure_callback


def _register_while_failed_deferred(original: Method) -> Method:
    def register_failure_callback(self: Any, callback: Callable[[], None]) -> None:
        self._check_owner()
        with self._state_lock:
            if self._failed or not self._callbacks_ran:
                self._callbacks.append(callback)
    return register_failure_callback


def _fail_unsettled_too(original: Method) -> Method:
    def _fail_pending(self: Any) -> None:
        original(self)
        collector = getattr(self, "_collector", None)
        failure = self._failure
        if collector is not None and failure is not None:
            for call in list(collector._resolved):
                call.value, call.error = None, failure.again()
    return _fail_pending


def _swap_ignores_shutdown(original: Method) -> Method:
    def _swap_in(self: Any, send_lock: threading.Lock, reply_lock: threading.RLock) -> None:
        closed, self._closed = self._closed, False
        try:
            original(self, send_lock, reply_lock)
        finally:
            self._closed = self._closed or closed
    return _swap_in


def _swap_keeps_callbacks_ran(original: Method) -> Method:
    def _swap_in(self: Any, send_lock: threading.Lock, reply_lock: threading.RLock) -> None:
        ran = self._callbacks_ran
        original(self, send_lock, reply_lock)
        self._callbacks_ran = ran
    return _swap_in


def _cleared_before_swap(original: Method) -> Method:
    def wait_for_old_incarnation(self: Any) -> None:
        original(self)
        with self._state_lock:
            if not self._closed:
                self._failure = None
    return wait_for_old_incarnation


def _no_wait(original: Method) -> Method:
    def _wait_failure_handled(self: Any) -> None:
        return None
    return _wait_failure_handled


def _death_by_rank(original: Method) -> Method:
    def _on_worker_death(self: Any, rank: int, pid: int, exitcode: int | None,
                         detected_ns: int) -> None:
        handle = next((h for h in self._res.handles if h.rank == rank), None)
        original(self, rank, pid if handle is None else handle.pid, exitcode, detected_ns)
    return _on_worker_death


def _full_startup(original: Method) -> Method:
    def start_incarnation(self: Any, startup_timeout: float) -> None:
        original(self, self.config.startup_timeout)
    return start_incarnation


def _pause_uncapped(original: Method) -> Method:
    from executor.restart import backoff_s

    def pause_before(cfg: Any, attempt: int, deadline: float) -> float:
        return backoff_s(cfg.restart_backoff, cfg.restart_backoff_max, attempt) if attempt else 0.0
    return pause_before


def _pause_every_attempt(original: Method) -> Method:
    def pause_before(cfg: Any, attempt: int, deadline: float) -> float:
        return float(original(cfg, max(attempt, 1), deadline))
    return pause_before


def _guard_ignores_driver(original: Method) -> Method:
    def _watch(death_fd: int, worker: int, driver: int, grace_s: float) -> None:
        original(death_fd, worker, -1, grace_s)
    return _watch


def _no_graces(original: Method) -> Method:
    def stop_processes(processes: Any, grace: float, sigterm_grace: float,
                       on_step: Callable[[str, list[int]], None] = lambda step, ranks: None) -> None:
        original(processes, 0.0, 0.0, on_step)
    return stop_processes


def _signal_as_code(original: Method) -> Method:
    def _reap(process: Any, fd: int) -> Any:
        end = original(process, fd)
        if end is not None and end.code is not None and end.code < 0:
            popen = getattr(process, "_popen", None)
            if popen is not None:
                popen.returncode = -end.code
            return type(end)(-end.code)
        return end
    return _reap


def _ray_any_group(original: Method) -> Method:
    def _death(self: Any, rank: int, exc: BaseException, detected_ns: int,
               group: Any = None) -> Any:
        return original(self, rank, exc, detected_ns, None)
    return _death


def _no_look(original: Method) -> Method:
    def _report_early_death(self: Any, group: Any) -> None:
        return None
    return _report_early_death


_LC = "executor.lifecycle:ExecutorLifecycle"
PLANTED: list[PlantedJudge] = [
    PlantedJudge("lifecycle_register_decides_by_failed", f"{_LC}.register_failure_callback",
                 "a callback registered while the failure is being handled runs at once and "
                 "again with the others", _register_by_failed),
    PlantedJudge("lifecycle_register_while_failed_deferred", f"{_LC}.register_failure_callback",
                 "a callback registered on a failed executor does not run at once",
                 _register_while_failed_deferred),
    PlantedJudge("lifecycle_failure_overrides_resolved", f"{_LC}._fail_pending",
                 "a failure fails calls whose replies were all in (futures not yet settled)",
                 _fail_unsettled_too),
    PlantedJudge("lifecycle_swap_ignores_shutdown", f"{_LC}._swap_in",
                 "a shutdown during the restart does not win: the new incarnation goes live",
                 _swap_ignores_shutdown),
    PlantedJudge("lifecycle_swap_keeps_callbacks_ran", f"{_LC}._swap_in",
                 "the restarted executor's failure runs no callback", _swap_keeps_callbacks_ran),
    PlantedJudge("lifecycle_failure_cleared_before_swap", f"{_LC}.wait_for_old_incarnation",
                 "calls reach the half-started incarnation before the swap",
                 _cleared_before_swap),
    PlantedJudge("lifecycle_restart_skips_failure_handling", f"{_LC}._wait_failure_handled",
                 "a restart swaps in while the old failure is still being handled", _no_wait),
    PlantedJudge("lifecycle_death_report_by_rank",
                 "executor.multiproc:MultiprocExecutor._on_worker_death",
                 "an old incarnation's late death report fails the new one", _death_by_rank),
    PlantedJudge("lifecycle_startup_not_capped_by_deadline",
                 "executor.multiproc:MultiprocExecutor.start_incarnation",
                 "a restart's start-up runs past the restart's deadline", _full_startup),
    PlantedJudge("lifecycle_backoff_not_capped_by_deadline", "executor.restart:pause_before",
                 "a restart's back-off runs past the restart's deadline", _pause_uncapped),
    PlantedJudge("lifecycle_backoff_before_first_attempt", "executor.restart:pause_before",
                 "a restart waits its back-off before its first attempt", _pause_every_attempt),
    PlantedJudge("lifecycle_guard_ignores_driver", "executor.exit_guard:_watch",
                 "the exit guard SIGKILLs its worker in an orderly shutdown",
                 _guard_ignores_driver),
    PlantedJudge("lifecycle_escalation_without_grace", "executor.resources:stop_processes",
                 "shutdown sends SIGTERM and SIGKILL without waiting its graces", _no_graces),
    PlantedJudge("lifecycle_signal_death_as_exit_code", "executor.exits:_reap",
                 "a worker killed by a signal is reported as exiting with that code",
                 _signal_as_code),
    PlantedJudge("lifecycle_ray_death_any_group", "executor.ray_executor:RayExecutor._death",
                 "an old Ray group's late death report fails the new group", _ray_any_group),
    PlantedJudge("lifecycle_ray_early_death_unseen",
                 "executor.ray_executor:RayExecutor._report_early_death",
                 "a Ray actor that died before the swap serves in the new group", _no_look),
]
