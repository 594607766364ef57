"""Workloads: what a scenario asks of the executor while faults hit it.

A workload is ``callable(executor) -> None``; it catches the executor's documented errors
and goes on, because the recording proxy has already logged each outcome for the oracles.
``rpc_sequence`` turns a list of call specs (as in a TOML suite) into a workload.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

from chaos.recording import RecordingExecutor
from executor import ExecutorError

Workload = Callable[[RecordingExecutor], None]  # given the recording proxy
_CALL_KEYS = {"method", "args", "timeout", "non_block", "unique_reply_rank", "repeat",
              "payload_bytes"}


@dataclasses.dataclass(frozen=True)
class CallSpec:
    method: str
    args: tuple[Any, ...] = ()
    timeout: float | None = None
    non_block: bool = False
    unique_reply_rank: int | None = None
    repeat: int = 1
    # The first argument (a str) padded to this many characters when the call is made: a
    # payload of several chunks that a suite's TOML still writes in one short line.
    payload_bytes: int | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str) -> CallSpec:
        from chaos.faults import PlanError

        unknown = sorted(set(data) - _CALL_KEYS)
        if unknown:
            raise PlanError(f"{where}.{unknown[0]}: unknown key; known: {sorted(_CALL_KEYS)}")
        if not isinstance(data.get("method"), str):
            raise PlanError(f"{where}.method: must be a method name (string)")
        args = data.get("args", [])
        if not isinstance(args, list):
            raise PlanError(f"{where}.args: must be a list, got {type(args).__name__}")
        size = data.get("payload_bytes")
        if size is not None and not (isinstance(size, int) and size > 0 and args
                                     and isinstance(args[0], str)):
            raise PlanError(f"{where}.payload_bytes: a positive size, for a call whose first "
                            f"argument is a string; got {size!r} with args {args!r}")
        return cls(data["method"], tuple(args), data.get("timeout"), bool(data.get("non_block", False)),
                   data.get("unique_reply_rank"), int(data.get("repeat", 1)), size)

    def to_dict(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v)
                for k, v in dataclasses.asdict(self).items() if v is not None}

    def sent_args(self) -> tuple[Any, ...]:
        """The arguments as sent: the first padded to ``payload_bytes`` (its tag kept first,
        so a reply given to another call still shows in a history's short repr)."""
        if self.payload_bytes is None:
            return self.args
        first = str(self.args[0])
        return (first + "." * max(0, self.payload_bytes - len(first)), *self.args[1:])


def call_quietly(ex: RecordingExecutor, spec: CallSpec) -> Any:
    """Make one call; documented errors are recorded by the proxy, not raised.  A method
    "module:function" is that function, run on each worker as ``function(worker, *args)``."""
    method: Any = spec.method
    if ":" in method:
        module, _, attr = method.partition(":")
        method = getattr(importlib.import_module(module), attr)
    try:
        return ex.collective_rpc(method, timeout=spec.timeout, args=spec.sent_args(),
                                 non_block=spec.non_block, unique_reply_rank=spec.unique_reply_rank)
    except (ExecutorError, TimeoutError, TypeError):
        return None


def rpc_sequence(calls: Sequence[CallSpec]) -> Workload:
    """Run the calls in order; futures of non-blocking calls are awaited at the end."""

    def workload(ex: RecordingExecutor) -> None:
        futures: list[Future[Any]] = []
        for spec in calls:
            for _ in range(spec.repeat):
                out = call_quietly(ex, spec)
                if isinstance(out, Future):
                    futures.append(out)
        for future in futures:
            try:
                future.result()
            except (ExecutorError, TimeoutError):
                pass

    return workload


STANDARD = [
    CallSpec("echo", ("warm-up",), timeout=5.0),
    CallSpec("sleep", (0.2,), timeout=1.0),  # the call the outcome table's faults hit
    CallSpec("echo", ("after",), timeout=1.0, repeat=3),
    CallSpec("get_rank", (), timeout=1.0, unique_reply_rank=1),
]


def standard(ex: RecordingExecutor) -> None:
    """Warm up, one ``sleep`` call for faults to hit, then calls that show recovery."""
    rpc_sequence(STANDARD)(ex)


def futures_mix(ex: RecordingExecutor) -> None:
    """Non-blocking calls awaited out of order, then a blocking one."""
    fs = [ex.collective_rpc("echo", args=(i,), non_block=True, timeout=3.0) for i in range(4)]
    fs.append(ex.collective_rpc("sleep", args=(0.1,), non_block=True, timeout=3.0))
    for f in reversed(fs):
        try:
            f.result()
        except (ExecutorError, TimeoutError):
            pass
    call_quietly(ex, CallSpec("echo", ("tail",), timeout=3.0))


def steady(ex: RecordingExecutor, n: int = 40) -> None:
    """Many short calls, for faults triggered by time or probability."""
    for i in range(n):
        call_quietly(ex, CallSpec("echo", (i,), timeout=2.0))
        call_quietly(ex, CallSpec("sleep", (0.005,), timeout=2.0))


CORE: dict[str, Workload] = {"standard": standard, "futures_mix": futures_mix, "steady": steady}
