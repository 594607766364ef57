"""Restarting the worker group in place: a new incarnation of every rank.

    ex.restart(reason)
      ├─ still serving? fail it first: calls in flight get ExecutorFailedError, callbacks run
      ├─ wait until that failure is handled in full (by whichever thread failed it: waiters
      │  woken, calls failed, callbacks run), then for the incarnation's shutdown: processes
      │  reaped, rings, pipes, monitor gone
      └─ attempt, while the budget lasts (back-off before each retry):
           ex.start_incarnation(): fresh resources, new rings (memfd), pipes, processes, a new
           torch.distributed init_method port (nnodes > 1: RESTART to every remote agent),
           READY from every rank
           ├─ start-up fails: that attempt's resources are shut down; it counted; retry
           └─ READY: under send, reply and state locks: failure cleared, incarnation + 1

Invariants:
- The executor object, its config, its registered failure callbacks and its callers stay;
  only what ``ExecutorResources`` owns is replaced.  The send and reply locks are handed on
  to the new resources, so a caller that picked up the lock before the swap still excludes
  every other writer and reader after it.
- The executor owns its incarnation's state: this module decides when, how often and by
  which deadline, and asks through ``check_restartable``, ``fail_for_restart``,
  ``wait_for_old_incarnation`` and ``start_incarnation`` (executor/multiproc.py).
- Until the swap, the executor stays failed: every call fails at once, nothing waits on the
  half-started incarnation.  A worker that dies before the swap (its monitor's report is
  swallowed then) is found right after it and fails the new incarnation as usual.
- A failure is never handled on the incarnation that replaced the one that failed: the
  swap waits (bounded) for the failure's handling, however late its thread runs.
- The back-off (``pause_before``) is never longer than what is left of the deadline, and
  there is none before the first attempt.
- Every attempt, successful or not, counts against ``restart_budget``; a start-up is bounded
  by ``startup_timeout`` and the whole restart by ``restart_timeout`` (each attempt gets what
  is left of it); a failed attempt shuts its own resources down, so nothing leaks.
- ``shutdown()`` during a restart wins: the restart stops what it started and raises.
- Failure callbacks must not call ``restart()`` (they run on the failing thread, possibly
  the one restarting): restart from the caller, as the engine does.
- Traces: ``executor.restart`` is a child of the caller's context (the engine's
  ``engine.recovery`` span, an OpenTelemetry span, ``TRACEPARENT``); the new incarnation's
  ``executor.startup`` is its child.
- Across nodes (``nnodes > 1``) the hub stays (executor/remote_site.py): the new
  incarnation's start sends RESTART to every remote ``faultlab worker`` agent, which stops
  what is left of its old workers and forks new ones (a new session key, the new rendezvous
  port).  A node whose agent is gone fails the attempt by name once it has been silent
  ``node_timeout`` (counted from no earlier than the attempt: its time to rejoin).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import telemetry
from executor.errors import ExecutorFailedError, RestartAborted, describe

if TYPE_CHECKING:
    from executor.config import ExecutorConfig
    from executor.lifecycle import ExecutorLifecycle


def restart_workers(ex: ExecutorLifecycle, reason: str) -> None:
    """Fail the current incarnation if needed, then start a new one (see module doc)."""
    with ex.restart_lock:
        ex.check_restartable()
        span = _start_span(ex, reason)
        try:
            with telemetry.use_parent(span.context if span is not None else None):
                _restart_locked(ex, reason)
        except BaseException as exc:
            if span is not None:
                span.end(exc)
            raise
        if span is not None:
            span.set_attribute("faultlab.incarnation", ex.incarnation)
            span.end()


def _restart_locked(ex: ExecutorLifecycle, reason: str) -> None:
    cfg = ex.config
    errors: list[str] = []
    attempt = 0
    deadline = time.monotonic() + cfg.restart_timeout
    while True:
        ex.fail_for_restart(reason)
        ex.wait_for_old_incarnation()
        ex.check_restartable()
        if ex.restarts_used >= cfg.restart_budget:
            raise ExecutorFailedError(
                f"restart budget spent ({ex.restarts_used} of {cfg.restart_budget} restarts "
                f"used; raise ExecutorConfig.restart_budget); the executor stays failed"
                + _attempts(errors))
        pause = pause_before(cfg, attempt, deadline)
        if pause:
            time.sleep(pause)
        left = deadline - time.monotonic()
        if left <= 0:
            raise ExecutorFailedError(
                f"restart did not finish within restart_timeout={cfg.restart_timeout:g} s "
                f"({attempt} attempt(s)); the executor stays failed" + _attempts(errors))
        attempt += 1
        ex.restarts_used += 1
        try:
            ex.start_incarnation(left)
            return
        except RestartAborted:
            raise
        except Exception as exc:  # noqa: BLE001 - a fault during restart: count it, retry
            errors.append(f"attempt {attempt}: {describe(exc)}")
            reason = f"attempt {attempt} of the restart failed"


def _attempts(errors: list[str]) -> str:
    return f"; this restart's attempts failed: {'; '.join(errors)}" if errors else ""


def pause_before(cfg: ExecutorConfig, attempt: int, deadline: float) -> float:
    """How long to wait before the attempt after ``attempt`` failed ones: none before the
    first, else the back-off, never past the restart's ``deadline`` (monotonic)."""
    if not attempt:
        return 0.0
    pause = backoff_s(cfg.restart_backoff, cfg.restart_backoff_max, attempt)
    return max(0.0, min(pause, deadline - time.monotonic()))


def backoff_s(base: float, cap: float, attempt: int) -> float:
    """The pause before retry ``attempt`` (1, 2, ...): ``base`` doubling, at most ``cap``."""
    return float(min(base * 2 ** (attempt - 1), cap))


def _start_span(ex: ExecutorLifecycle, reason: str) -> Any:
    rec = telemetry.get_recorder()
    if not rec.enabled:
        return None
    return rec.start_span("executor.restart", telemetry.caller_parent(), {
        "faultlab.reason": reason, "faultlab.from_incarnation": ex.incarnation})
