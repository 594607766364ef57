"""The executor's exceptions: one small hierarchy, so callers catch what they mean.

    ExecutorError (RuntimeError)
    ├── ExecutorFailedError      the executor is dead: a worker exited, the queue lost sync, or it shut down
    │   ├── ForeignProcessError  used from a forked child of the process that created it
    │   └── RestartAborted       shutdown() won over a restart in progress
    ├── WorkerError              a worker method raised; the worker keeps serving
    │   └── CorruptMessageError  a message failed its checksum; it was skipped, the queue is still in sync
    ├── WorkerStartupError       a worker failed before READY; carries the worker's own traceback
    ├── QueueCorruptedError      shared-memory metadata is damaged; the queue cannot be trusted any more
    ├── QueueFullError           the writer waited its whole deadline on a reader that did not read
    ├── SharedMemoryError        a queue's shared memory could not be allocated at start-up
    ├── ResourceLimitError       an OS limit (open files) is too low for the workers asked for
    └── AuthenticationError      a TCP message failed its HMAC: rejected, never unpickled
    RequestPicklingError (TypeError, pickle.PicklingError)   arguments cannot be pickled; nothing was sent
    ReplyUnpicklingError (ExecutorError, pickle.UnpicklingError)  a reply arrived but could not be unpickled
"""

from __future__ import annotations

import pickle
from typing import Any


def safe_str(obj: object, what: str = "str") -> str:
    """``str(obj)``, or a note saying it failed: hostile objects must not end a process."""
    try:
        return str(obj)
    except BaseException as exc:  # noqa: BLE001 - even SystemExit from a __str__
        return f"<{what}() of {type(obj).__qualname__} raised {type(exc).__qualname__}>"


def describe(exc: BaseException) -> str:
    """``"TypeName: message"`` for any exception, whatever its ``__str__`` does."""
    return f"{type(exc).__name__}: {safe_str(exc)}"


class ExecutorError(RuntimeError):
    """Base of every error the executor raises on purpose."""


class ExecutorFailedError(ExecutorError):
    """The executor can no longer serve calls; the message says which rank, pid and why.

    The facts are fields too (None where they do not apply): ``rank``, ``pid`` and
    ``exitcode`` of a dead worker (a negative exit code is the signal), ``node`` and
    ``ranks`` of a lost node.  Every call that fails for the same reason gets its own copy
    (``again()``), with the same message and fields."""

    def __init__(
        self,
        message: str,
        *,
        rank: int | None = None,
        pid: int | None = None,
        exitcode: int | None = None,
        node: int | None = None,
        ranks: list[int] | None = None,
    ) -> None:
        super().__init__(message)
        self.rank, self.pid, self.exitcode = rank, pid, exitcode
        self.node, self.ranks = node, ranks

    def fields(self) -> dict[str, Any]:
        return {"rank": self.rank, "pid": self.pid, "exitcode": self.exitcode,
                "node": self.node, "ranks": self.ranks}

    def again(self) -> ExecutorFailedError:
        """A fresh error with the same message and fields (one per failed call)."""
        return type(self)(str(self.args[0]) if self.args else "", **self.fields())

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_failed, (type(self), self.args[0] if self.args else "", self.fields()))


def _rebuild_failed(cls: type[ExecutorFailedError], message: str,
                    fields: dict[str, Any]) -> ExecutorFailedError:
    return cls(message, **fields)


class RestartAborted(ExecutorFailedError):
    """``shutdown()`` was called while a restart was starting workers."""


class ForeignProcessError(ExecutorFailedError):
    """The executor was used from a process other than the one that created it (a fork)."""


class WorkerError(ExecutorError):
    """A worker's method raised; carries the remote exception's type, message and traceback."""

    def __init__(
        self,
        message: str,
        *,
        rank: int | None = None,
        exc_type: str = "",
        exc_message: str = "",
        remote_traceback: str = "",
    ) -> None:
        super().__init__(message)
        self.rank = rank
        self.exc_type = exc_type
        self.exc_message = exc_message
        self.remote_traceback = remote_traceback

    def __str__(self) -> str:
        text = super().__str__()
        if self.remote_traceback:
            text += "\n\nRemote traceback:\n" + self.remote_traceback.rstrip()
        return text

    def __reduce__(self) -> tuple[Any, ...]:
        kwargs = {
            "rank": self.rank,
            "exc_type": self.exc_type,
            "exc_message": self.exc_message,
            "remote_traceback": self.remote_traceback,
        }
        return (_rebuild_worker_error, (type(self), self.args[0], kwargs))


def _rebuild_worker_error(cls: type[WorkerError], message: str, kwargs: dict[str, Any]) -> WorkerError:
    return cls(message, **kwargs)


class CorruptMessageError(WorkerError):
    """A message's payload failed its checksum; it was discarded and the queue stays usable.

    ``msg_id`` is the damaged message's id (the rpc id of its call) and ``rank`` the rank
    whose reply it was, when known.  It is a ``WorkerError`` because it is what a call gets
    in place of a worker's reply, as a worker's own error would be."""

    def __init__(
        self,
        message: str,
        *,
        msg_id: int = 0,
        rank: int | None = None,
        exc_type: str = "CorruptMessageError",
        exc_message: str = "",
        remote_traceback: str = "",
    ) -> None:
        super().__init__(message, rank=rank, exc_type=exc_type, exc_message=exc_message,
                         remote_traceback=remote_traceback)
        self.msg_id = msg_id

    def for_rank(self, rank: int) -> CorruptMessageError:
        """The same error, for the call that expected rank ``rank``'s reply."""
        return type(self)(self.args[0], msg_id=self.msg_id, rank=rank, exc_type=self.exc_type,
                          exc_message=self.exc_message, remote_traceback=self.remote_traceback)

    def __reduce__(self) -> tuple[Any, ...]:
        kwargs = {"msg_id": self.msg_id, "rank": self.rank, "exc_type": self.exc_type,
                  "exc_message": self.exc_message, "remote_traceback": self.remote_traceback}
        return (_rebuild_worker_error, (type(self), self.args[0], kwargs))


class WorkerStartupError(ExecutorError):
    """A worker failed to start; the message carries the worker's own traceback."""


class QueueCorruptedError(ExecutorError):
    """Shared-memory queue metadata is inconsistent (clobbered flags or sequence numbers)."""


class QueueFullError(ExecutorError, TimeoutError):
    """The writer's deadline passed while a reader had not freed the next chunk."""


class SharedMemoryError(ExecutorError):
    """A queue's shared memory could not be allocated; the message names the queue, the bytes
    needed and the bytes free."""


class ResourceLimitError(ExecutorError):
    """An OS limit (RLIMIT_NOFILE) cannot fit the workers asked for; refused before any started."""


class RequestPicklingError(TypeError, pickle.PicklingError):
    """The call's method or arguments cannot be pickled; nothing was sent."""


class ReplyUnpicklingError(ExecutorError, pickle.UnpicklingError):
    """A worker's reply arrived intact but could not be unpickled in the driver."""


class AuthenticationError(ExecutorError):
    """A message from the network failed its HMAC check; it was rejected and never unpickled."""
