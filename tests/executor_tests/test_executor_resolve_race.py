"""A call is resolved once, whoever races for it: the collector with the reply, the caller
whose deadline passed, and a failing executor may resolve the same call at the same time."""

from __future__ import annotations

import threading
from concurrent.futures import Future

from executor.calls import PendingCall, ReplyCollector, RpcFuture


def _collector() -> ReplyCollector:
    return ReplyCollector([], threading.Lock(), lambda: None, lambda error: None, lambda c, e: None)


def test_racing_resolvers_agree_on_one_outcome() -> None:
    collector = _collector()
    for _ in range(200):
        future = RpcFuture(collector)
        call = PendingCall(1, "echo", [0], True, 1.0, 0.0, future)
        future.call = call
        start = threading.Barrier(3)
        outcomes: list[tuple[BaseException | None, object]] = [
            (None, "the reply"), (TimeoutError("deadline"), None), (RuntimeError("failed"), None),
        ]

        threads = [threading.Thread(target=_resolve, args=(collector, call, start, *o)) for o in outcomes]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        collector.settle_resolved()
        assert call.done and (call.error, call.value) in outcomes
        assert _outcome(future) == (call.error, call.value)  # the future got the winner's outcome


def _resolve(collector: ReplyCollector, call: PendingCall, start: threading.Barrier,
             error: BaseException | None, value: object) -> None:
    start.wait()
    collector.resolve(call, error, value)


def _outcome(future: Future) -> tuple[BaseException | None, object]:
    error = future.exception(timeout=0)
    return (error, None) if error is not None else (None, future.result(timeout=0))
