"""What travels between the driver and the workers, and how a worker's exit is described.

    driver ── REQUEST  (msg_id = rpc id)  ──► rpc queue ──► every worker
    worker ── REPLY_OK / REPLY_ERROR (msg_id = the same rpc id) ──► its reply queue ──► driver
    worker ── FATAL (msg_id 0): the worker's queue is damaged; it exits with EXIT_QUEUE_CORRUPTED
    worker ── (EXIT_CAUSE, code, cause) ──► its READY pipe, just before it exits for a cause of
              its own: only then does the driver name a cause (an exit code alone names none:
              a user's ``os._exit(4)`` is "exited with code 4", nothing more)

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
EXIT_CAUSE = "exit"  # the READY-pipe message a worker sends before exiting for its own cause
# What a worker says when it exits with one of these codes: sent by the worker (its own
# word), never inferred by the driver from the code, which a user's code may use too.
EXIT_CAUSES = {
    EXIT_STARTUP_FAILED: "failed to start",
    EXIT_QUEUE_CORRUPTED: "found its shared-memory queue damaged",
    EXIT_PARENT_DIED: "saw the driver die",
}
REAPED_ELSEWHERE = ("exited; its exit status is unknown: it was reaped by another handler "
                    "(SIGCHLD set to SIG_IGN, or a SIGCHLD handler that waits for any child)")


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


def describe_exit(exitcode: int | None, cause: str | None = None) -> str:
    """Say how a process ended, e.g. 'was killed by SIGKILL' or 'exited with code 143 after
    SIGTERM'.  ``exitcode`` None: it ended but another handler reaped it (the status is
    lost); a process still running is never described here.  ``cause`` is what the worker
    itself said it exited for (its ``EXIT_CAUSE`` message), never guessed from the code."""
    if exitcode is None:
        text = REAPED_ELSEWHERE
    elif exitcode < 0:
        text = f"was killed by {_signal_name(-exitcode)}"
    elif exitcode > 128 and exitcode - 128 < signal.NSIG:
        text = f"exited with code {exitcode} after {_signal_name(exitcode - 128)}"
    else:
        text = f"exited with code {exitcode}"
    return f"{text} (it reported that it {cause})" if cause else text


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
