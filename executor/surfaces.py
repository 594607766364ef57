"""The surfaces other packages rely on, as small ``Protocol``s: an executor and a span.

    chaos (scenarios, proxies, workloads) ──uses──► ExecutorLike ◄── MultiprocExecutor, mutants,
    engine                                                            RecordingExecutor
    executor (driver RPC spans)           ──uses──► SpanLike     ◄── telemetry.Span,
                                                                     telemetry.NonRecordingSpan

Invariants:
- Only what a caller outside the defining package uses is here: code that needs more (the
  executor's resources, a recorder's journal) names the concrete class instead.
- Structural: nothing subclasses these; mypy checks each implementation where it is passed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from telemetry import SpanContext


class ExecutorLike(Protocol):
    """What chaos and the engine call on an executor (``MultiprocExecutor`` or a stand-in)."""

    @property
    def worker_pids(self) -> list[int]: ...

    @property
    def is_failed(self) -> bool: ...

    @property
    def world_size(self) -> int: ...

    def collective_rpc(
        self, method: str | Callable[..., Any], timeout: float | None = None,
        args: Sequence[Any] = (), kwargs: dict[str, Any] | None = None, non_block: bool = False,
        unique_reply_rank: int | None = None,
    ) -> Any: ...

    def register_failure_callback(self, callback: Callable[[], None]) -> None: ...

    def shutdown(self) -> None: ...


class SpanLike(Protocol):
    """A started span, recording or not (``telemetry.Span``, ``telemetry.NonRecordingSpan``)."""

    @property
    def context(self) -> SpanContext: ...

    @property
    def ended(self) -> bool: ...

    def set_attribute(self, key: str, value: Any) -> None: ...

    def set_attributes(self, attributes: Mapping[str, Any]) -> None: ...

    def add_event(self, name: str, attributes: dict[str, Any] | None = None) -> None: ...

    def end(self, error: BaseException | str | None = None, end_ns: int | None = None) -> None: ...


class RpcSpanLike(SpanLike, Protocol):
    """The driver's span of one RPC (``telemetry.span.ClientSpan``): its phases are written
    as compact records, expanded into the enqueue and dequeue spans when a run is read."""

    trace_id: int
    span_id: int

    def sent(self, start_ns: int, rpc_id: int, size: int, non_block: bool,
             timeout: float | None, reply_rank: int | None) -> None: ...

    def enqueue_failed(self, start_ns: int, error: BaseException | str | None) -> None: ...

    def dequeued(self, rank: int, start_ns: int) -> None: ...

    def dequeue_failed(self, rank: int, start_ns: int, error: BaseException | str | None,
                       timed_out: bool = False) -> None: ...


if TYPE_CHECKING:  # mypy checks here that the real classes have these surfaces
    from executor.multiproc import MultiprocExecutor
    from telemetry import NonRecordingSpan, Span
    from telemetry.span import ClientSpan

    def _conforms(ex: MultiprocExecutor, span: Span, off: NonRecordingSpan, rpc: ClientSpan,
                  ) -> tuple[ExecutorLike, SpanLike, SpanLike, RpcSpanLike]:
        return ex, span, off, rpc
