"""The driver protocol: how a target's driver subprocess reports to faultlab's observer.

    driver subprocess (any Python with the target installed)        faultlab (observer)
    Reporter.ready(processes) ──── {"ev": "ready", ...} ────────────►  process tree by role/rank
    Reporter.invoke(i, what)  ──── {"ev": "invoke", "id": i, ...} ──►  call i started
    Reporter.ok(i, value)     ──── {"ev": "ok", "id": i, "value"} ─►  call i ended well
    Reporter.fail(i, exc)     ──── {"ev": "fail", "id": i, "type", "message"} ► call i failed
    Reporter.error(exc)       ──── {"ev": "error", "type", "message"} ► the caller saw the
                                                                     executor fail (once)
    Reporter.done()           ──── {"ev": "done"} ───────────────────►  the workload finished

One JSON object per line on the driver's stdout, flushed at once; every event carries ``t``,
``time.time_ns()`` in the driver (one clock on one machine, so the observer compares it with
its own fault times).  A process entry is ``{"role": ..., "rank": int | None, "pid": int}``;
roles are free strings, by convention ``driver``, ``engine_core``, ``worker``, ``helper``.
Values are reduced to JSON (``digest``): lists of ints stay as they are (token ids), anything
else becomes its repr, cut to 200 characters.  A driver whose workload is a unit of work per
rank may use ``call_value(call_id, rank)`` as each rank's result: a pure function, so the
observer knows every fault-free value without a reference run.  After ``done`` a driver
sleeps the spec's ``linger_s`` (if any) before shutting its executor down.

This module is imported by driver scripts that run in another environment (the vLLM
target's own venv), so it uses the standard library only and imports nothing of faultlab.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import IO, Any

PROTOCOL_VERSION = 1


def digest(value: Any) -> Any:
    """A JSON-able stand-in for a call's value, equal for equal outputs."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)) and all(isinstance(v, (int, str, float)) for v in value):
        return list(value)
    if isinstance(value, (list, tuple)):
        return [digest(v) for v in value]
    if isinstance(value, dict):
        return {str(k): digest(v) for k, v in value.items()}
    text = repr(value)
    return text if len(text) <= 200 else text[:200] + "..."


class Reporter:
    """The driver's side: one line per event on ``stream`` (stdout by default)."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        self._stream = stream if stream is not None else sys.stdout
        self._errored = False

    def _emit(self, event: dict[str, Any]) -> None:
        event["t"] = time.time_ns()
        self._stream.write(json.dumps(event, default=repr) + "\n")
        self._stream.flush()

    def ready(self, processes: list[dict[str, Any]], **info: Any) -> None:
        self._emit({"ev": "ready", "v": PROTOCOL_VERSION, "procs": processes, **info})

    def invoke(self, call_id: int, what: str) -> None:
        self._emit({"ev": "invoke", "id": call_id, "what": what})

    def ok(self, call_id: int, value: Any) -> None:
        self._emit({"ev": "ok", "id": call_id, "value": digest(value)})

    def fail(self, call_id: int, exc: BaseException) -> None:
        self._emit({"ev": "fail", "id": call_id, "type": type(exc).__name__,
                    "message": _message(exc)})

    def error(self, exc: BaseException) -> None:
        """The caller saw the executor fail (reported once; later calls only ``fail``)."""
        if not self._errored:
            self._errored = True
            self._emit({"ev": "error", "type": type(exc).__name__, "message": _message(exc)})

    def done(self, **info: Any) -> None:
        self._emit({"ev": "done", **info})

    def calls(self, count: int, run: Callable[[int], Any],
              fatal: type[BaseException] | tuple[type[BaseException], ...]) -> None:
        """Make calls ``0 .. count-1`` with ``run(i)``, reporting how each ends; an exception
        of type ``fatal`` says the executor failed (the ``error``).  Every call is made, even
        after a failure, so each later call's end is seen too; then ``done``."""
        for i in range(count):
            self.invoke(i, "work")
            try:
                self.ok(i, run(i))
            except fatal as exc:
                self.fail(i, exc)
                self.error(exc)
            except Exception as exc:  # noqa: BLE001 - every call's end is reported
                self.fail(i, exc)
        self.done()


def _message(exc: BaseException) -> str:
    try:
        text = str(exc)
    except BaseException:  # noqa: BLE001 - a hostile __str__ must not end the driver
        text = f"<str() of {type(exc).__name__} raised>"
    cause = exc.__cause__ or exc.__context__
    if cause is not None and not text:
        return _message(cause)
    return text[:2000]


def call_value(call_id: int, rank: int) -> int:
    """What rank ``rank`` returns for call ``call_id`` in the unit-of-work workloads."""
    return (call_id * 1_000_003 + rank * 7_919 + 17) % 1_000_000_007


def parse(line: str) -> dict[str, Any] | None:
    """One event from a line of the driver's stdout; None for a line that is not one (a
    target's own prints)."""
    line = line.strip()
    if not line.startswith("{"):
        return None
    try:
        event = json.loads(line)
    except ValueError:
        return None
    return event if isinstance(event, dict) and "ev" in event else None
