"""Ctrl-C at every point of a call where CPython can raise it, one point per run.

    sweep_interrupts(executor, call)
      count:  run call() under a tracer ──► the distinct points it passes, in order
      for each point p:
          run call() with KeyboardInterrupt raised the first time p is reached
          ──► check: the interrupt reached the caller; no lock of the executor is held
                     (another thread acquires each one); the executor has not failed;
                     the next calls, blocking and non-blocking, return their own results
                     within a bound
      ──► SweepReport: points found, points hit, violations (each naming its point)

Where an interrupt can land.  CPython 3.11 runs signal handlers (and so raises
KeyboardInterrupt) only where it checks its "eval breaker": right after a call returns, on a
backward jump, and when a function starts.  The tracer (``sys.settrace`` with opcode events,
in the main thread, for frames of the files swept) counts a point at the first opcode run
after a ``CALL`` or a ``JUMP_BACKWARD`` that did not raise, and raises KeyboardInterrupt
there: the instruction after a call shares the call's exception region except at region
edges, where the sweep is the stricter of the two (it may raise just outside a ``try`` that
the call itself is in).  A point is ``file:function:offset``; loops pass the same point
many times and it is swept the first time only.

Random-timing tests (a SIGINT timer) find a lost lock once in hundreds of runs; this finds
it in one sweep, and a seed is not needed: the sweep is exhaustive over the points a call
passes.  Points a run does not reach again (a wait that was not needed this time) are
counted as missed, not as passes.
"""

from __future__ import annotations

import dataclasses
import dis
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from types import CodeType, FrameType
from typing import Any

import executor as _executor_package

_CALL = dis.opmap.get("CALL", -1)
_BACK = {dis.opmap[name] for name in ("JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT") if name in dis.opmap}
_MARKS = {_CALL, *_BACK}
EXECUTOR_DIR = os.path.dirname(os.path.abspath(_executor_package.__file__))
CHECK_TIMEOUT_S = 5.0


class _Injected(KeyboardInterrupt):
    """The sweep's own KeyboardInterrupt, so a real Ctrl-C is never mistaken for it."""


@dataclasses.dataclass
class SweepReport:
    points: list[str]  # every distinct point the counting run passed, in order
    hit: int = 0  # runs in which the interrupt was raised at its point
    missed: list[str] = dataclasses.field(default_factory=list)  # points a later run did not reach
    violations: list[str] = dataclasses.field(default_factory=list)

    def summary(self) -> str:
        return (f"{len(self.points)} points, {self.hit} interrupted, {len(self.missed)} not reached "
                f"again, {len(self.violations)} violations")


class Tracer:
    """Counts the points of the swept files, or raises at one of them (``target``)."""

    def __init__(self, roots: Sequence[str], target: str | None) -> None:
        self.roots = tuple(roots)
        self.target = target
        self.seen: dict[str, None] = {}  # ordered set
        self.fired = False
        self._after: dict[int, bool] = {}  # frame id -> the last opcode was a mark
        self._wanted: dict[str, bool] = {}

    def _swept(self, code: CodeType) -> bool:
        wanted = self._wanted.get(code.co_filename)
        if wanted is None:
            wanted = self._wanted[code.co_filename] = code.co_filename.startswith(self.roots)
        return wanted

    def global_trace(self, frame: FrameType, event: str, _arg: Any) -> Any:
        if event != "call" or self.fired or not self._swept(frame.f_code):
            return None
        frame.f_trace_opcodes = True
        frame.f_trace_lines = False
        return self.local_trace

    def local_trace(self, frame: FrameType, event: str, _arg: Any) -> Any:
        key = id(frame)
        if event == "exception":  # the call raised: no check for signals follows it
            self._after[key] = False
            return self.local_trace
        if event == "return":
            self._after.pop(key, None)
            return None
        if event != "opcode":
            return self.local_trace
        code, offset = frame.f_code, frame.f_lasti
        if self._after.get(key):
            point = f"{os.path.basename(code.co_filename)}:{code.co_name}:{offset}"
            first = point not in self.seen
            self.seen.setdefault(point, None)
            if first and point == self.target and not self.fired:
                self.fired = True
                self._after.clear()
                raise _Injected(f"interrupt sweep: {point}")
        self._after[key] = code.co_code[offset] in _MARKS
        return self.local_trace


def traced(tracer: Tracer, call: Callable[[], Any]) -> BaseException | None:
    """Run ``call`` with ``tracer`` on this thread; the exception it raised, if any."""
    sys.settrace(tracer.global_trace)
    try:
        call()
    except BaseException as exc:  # noqa: BLE001 - judged by the sweep
        return exc
    finally:
        sys.settrace(None)
    return None


def held_locks(locks: dict[str, Any], timeout: float = 1.0) -> list[str]:
    """The names of ``locks`` that another thread cannot acquire within ``timeout``."""
    held: list[str] = []

    def probe(name: str, lock: Any) -> None:
        if lock.acquire(timeout=timeout):
            lock.release()
        else:
            held.append(name)

    threads = [threading.Thread(target=probe, args=item) for item in locks.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sorted(held)


def executor_locks(ex: Any) -> dict[str, Any]:
    """The locks of an executor that a caller's thread takes (``caller_locks()``)."""
    return dict(ex.caller_locks())


def _in_step(ex: Any, tag: int) -> str | None:
    """None if a blocking and a non-blocking call both return their own results in time.

    They run on another thread, so that a call that blocks for good (a lock no timeout
    covers) is reported, not a hung sweep."""
    problem: list[str | None] = []
    thread = threading.Thread(target=lambda: problem.append(_calls_in_step(ex, tag)),
                              name="faultlab-sweep-check", daemon=True)
    thread.start()
    thread.join(3 * CHECK_TIMEOUT_S)
    if not problem:
        return f"the next call did not return within {3 * CHECK_TIMEOUT_S:g} s"
    return problem[0]


def _calls_in_step(ex: Any, tag: int) -> str | None:
    try:
        got = ex.collective_rpc("echo", args=(tag,), timeout=CHECK_TIMEOUT_S)
        if got != [tag] * ex.world_size:
            return f"the next call returned {got!r}, not its own {tag!r}"
        future = ex.collective_rpc("echo", args=(tag + 1,), timeout=CHECK_TIMEOUT_S, non_block=True)
        got = future.result(timeout=CHECK_TIMEOUT_S + 1)
        if got != [tag + 1] * ex.world_size:
            return f"the next non-blocking call returned {got!r}, not its own {tag + 1!r}"
    except BaseException as exc:  # noqa: BLE001 - the violation says what happened
        return f"the next call raised {type(exc).__name__}: {exc}"
    return None


def _check(ex: Any, point: str, raised: BaseException | None, tag: int,
           locks: Callable[[Any], dict[str, Any]]) -> list[str]:
    out = []
    if not isinstance(raised, _Injected):
        what = "nothing" if raised is None else f"{type(raised).__name__}: {raised}"
        out.append(f"{point}: the caller got {what}, not the KeyboardInterrupt")
    held = held_locks(locks(ex))
    if held:
        out.append(f"{point}: lock(s) {', '.join(held)} left held")
        return out  # the next call would only block on them
    if ex.is_failed:
        out.append(f"{point}: the executor failed after a Ctrl-C")
        return out
    problem = _in_step(ex, tag)
    if problem is not None:
        out.append(f"{point}: {problem}")
    return out


def code_roots(ex: Any) -> tuple[str, ...]:
    """The files of the executor's code: executor/, and wherever its class and its reply
    collector's class (and their bases) are defined (a planted bug lives in chaos.mutants)."""
    roots = {EXECUTOR_DIR}
    for obj in (ex, getattr(ex, "_collector", None)):
        for cls in type(obj).__mro__ if obj is not None else ():
            module = sys.modules.get(cls.__module__)
            path = getattr(module, "__file__", None)
            if path and cls.__module__ != "builtins":
                roots.add(os.path.abspath(path))
    return tuple(sorted(roots))


def sweep_interrupts(
    ex: Any,
    call: Callable[[], Any],
    roots: Iterable[str] | None = None,
    locks: Callable[[Any], dict[str, Any]] = executor_locks,
    budget_s: float = 120.0,
) -> SweepReport:
    """Raise KeyboardInterrupt at each point ``call()`` passes in ``roots``, one per run.

    Must run on the main thread (where Ctrl-C lands).  Stops at the first violation that
    leaves the executor unusable (a held lock, a failure) and when ``budget_s`` is spent."""
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("sweep_interrupts runs on the main thread, where Ctrl-C lands")
    roots = code_roots(ex) if roots is None else tuple(roots)
    counter = Tracer(roots, None)
    error = traced(counter, call)
    if error is not None:
        raise RuntimeError(f"the call to sweep fails without an interrupt: {error!r}") from error
    report = SweepReport(list(counter.seen))
    end = time.monotonic() + budget_s
    for i, point in enumerate(report.points):
        if time.monotonic() > end:
            report.missed += report.points[i:]
            break
        tracer = Tracer(roots, point)
        raised = traced(tracer, call)
        if not tracer.fired:
            report.missed.append(point)
            continue
        report.hit += 1
        problems = _check(ex, point, raised, 1000 + 2 * i, locks)
        report.violations += problems
        if problems and (ex.is_failed or any("held" in p or "within" in p for p in problems)):
            break
    return report
