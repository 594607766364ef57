"""The surfaces other packages rely on, as small ``Protocol``s: an executor and a span.

    chaos (scenarios, proxies, workloads) ──uses──► ExecutorLike ◄── MultiprocExecutor, mutants,
    engine                                                            RecordingExecutor
    executor (startup, shutdown spans)    ──uses──► SpanLike     ◄── telemetry.Span,
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


if TYPE_CHECKING:  # mypy checks here that the real classes have these surfaces
    from executor.multiproc import MultiprocExecutor
    from telemetry import NonRecordingSpan, Span

    def _conforms(ex: MultiprocExecutor, span: Span, off: NonRecordingSpan,
                  ) -> tuple[ExecutorLike, SpanLike, SpanLike]:
        return ex, span, off
