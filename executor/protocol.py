"""What travels between the driver and the workers, and what a worker's exit code means.

    driver ── REQUEST  (msg_id = rpc id)  ──► rpc queue ──► every worker
    worker ── REPLY_OK / REPLY_ERROR (msg_id = the same rpc id) ──► its reply queue ──► driver
    worker ── FATAL (msg_id 0): the worker's queue is damaged; it exits with EXIT_QUEUE_CORRUPTED

A request is ``(method, args, kwargs)``: ``method`` is a name or a callable; the context of
the driver's RPC span, when traced, rides in the frame header (``serialization.TRACE_HEADER``).
A REPLY_OK carries the
value; REPLY_ERROR and FATAL carry a ``RemoteError``.  Every reply echoes its request's id,
so the driver can drop a reply whose call already timed out.
"""

from __future__ import annotations

import signal
import traceback
from typing import NamedTuple

from executor.errors import safe_str

REQUEST, REPLY_OK, REPLY_ERROR, FATAL = 1, 2, 3, 4
ALL_RANKS = -1

EXIT_STARTUP_FAILED = 3
EXIT_QUEUE_CORRUPTED = 4
EXIT_PARENT_DIED = 5
_EXIT_MEANINGS = {
    EXIT_STARTUP_FAILED: "failed to start",
    EXIT_QUEUE_CORRUPTED: "found its shared-memory queue damaged",
    EXIT_PARENT_DIED: "saw the driver die",
}


class RemoteError(NamedTuple):
    """An exception as plain strings, so that any exception can cross processes."""

    type_name: str
    message: str
    traceback: str

    @classmethod
    def capture(cls, exc: BaseException) -> RemoteError:
        """Whatever can be captured: an exception whose ``__str__`` raises still gives its
        type and traceback, with a note in place of the message."""
        kind = type(exc)
        return cls(f"{kind.__module__}.{kind.__qualname__}", safe_str(exc), _traceback_text(exc))


def _traceback_text(exc: BaseException) -> str:
    try:
        return "".join(traceback.format_exception(exc))
    except BaseException:  # noqa: BLE001 - e.g. a hostile __notes__ or cause chain
        try:
            frames = "".join(traceback.format_tb(exc.__traceback__))
        except BaseException:  # noqa: BLE001
            frames = ""
        return f"Traceback (most recent call last):\n{frames}{type(exc).__qualname__}: {safe_str(exc)}\n"


def method_name(method: object) -> str:
    """What a call is called in spans and messages: the method's name, or the callable's."""
    return method if isinstance(method, str) else getattr(method, "__name__", "callable")


def span_name(cache: dict[str, str], prefix: str, method: object) -> str:
    """``prefix`` + ``method_name(method)``, kept in ``cache`` per method name (at most 1000
    names: a span name is made once per name on the RPC path, not per call)."""
    name = f"{prefix}{method_name(method)}"
    if type(method) is str and len(cache) < 1000:
        cache[method] = name
    return name


def describe_exit(exitcode: int | None) -> str:
    """Say how a process ended, e.g. 'killed by SIGKILL' or 'exited with code 143 (SIGTERM)'."""
    if exitcode is None:
        return "is still running"
    if exitcode < 0:
        return f"was killed by {_signal_name(-exitcode)}"
    if exitcode > 128 and exitcode - 128 < signal.NSIG:
        return f"exited with code {exitcode} after {_signal_name(exitcode - 128)}"
    meaning = _EXIT_MEANINGS.get(exitcode)
    return f"exited with code {exitcode}" + (f" ({meaning})" if meaning else "")


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
