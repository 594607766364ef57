"""``interrupt_publish``: a Ctrl-C at each point of a request's publish, each followed by a
reader that took the chunk and by calls that lap the ring: the workload that tells a writer
which resumes a cut publish wrongly from one that does not.

    count:  one call under chaos.interrupt_sweep.Tracer ──► the points it passes in the
            request writer's _publish and _published (executor/shm_queue.py)
    for each point p:
        the call, with KeyboardInterrupt raised at p ─► the caller must get it
        a pause of one reader block slice ─► a worker asleep on its doorbell (a cut publish
            may not have rung it) wakes and takes whatever chunk the cut left visible
        LAP_CALLS calls, more than the ring has chunks ─► each returns its own result, and the
            writer comes round to the cut chunk again, where a publish redone after it was
            visible left the read flags of the workers that took it cleared

Why the pause: chaos.interrupt_sweep checks at once after each interrupt, so the workers have
usually slept through the cut and not taken the chunk, and a wrongly redone publish harms no
one (chaos.mutants.RedoesVisiblePublish then goes unseen).  Every call is recorded with its
expectation (``check="interrupt"``, ``expect_errors=OK``); chaos.edge_oracles judges them.

The same cut as a fault (``interrupt_driver`` at phase ``after_written``, which the swarm
draws beside any other fault): ``interrupt_once_visible`` runs at the driver's
queue.before_publish and arms a one-shot trace; as the writer calls ``_published`` (its written
flag just set, the published counter not yet moved) it pauses SETTLE_S, then SIGINTs the
driver, so the KeyboardInterrupt lands right there, as a Ctrl-C does (the scenario's handler).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from chaos.interrupt_sweep import Tracer, traced
from chaos.recording import RecordingExecutor
from executor import shm_queue
from executor.waiting import DEFAULT_POLICY

PUBLISH_FUNCTIONS = ("_publish", "_published")  # QueueWriter's steps of one publish
SETTLE_S = DEFAULT_POLICY.block_slice_s + 0.05  # a sleeping reader wakes within one slice
LAP_CALLS = 9  # more than the default ring's 8 chunks
OK = frozenset({"ok"})
_QUEUE_FILE = os.path.abspath(shm_queue.__file__)


def publish_points(call: Callable[[], Any]) -> list[str]:
    """The interrupt points ``call()`` passes inside a publish, in order."""
    counter = Tracer((_QUEUE_FILE,), None)
    error = traced(counter, call)
    if error is not None:
        raise RuntimeError(f"the call fails without an interrupt: {error!r}") from error
    return [p for p in counter.seen if p.split(":")[1] in PUBLISH_FUNCTIONS]


def cut_at(point: str, call: Callable[[], Any]) -> str:
    """Run ``call()`` with KeyboardInterrupt raised at ``point``; raises AssertionError when
    the caller got anything else.  Returns whether it fired ("cut" or "not reached")."""
    tracer = Tracer((_QUEUE_FILE,), point)
    raised = traced(tracer, call)
    if not tracer.fired:
        return "not reached"
    if not isinstance(raised, KeyboardInterrupt):
        what = "nothing" if raised is None else f"{type(raised).__name__}: {raised}"
        raise AssertionError(f"a Ctrl-C at {point}: the caller got {what}, not KeyboardInterrupt")
    return "cut"


def interrupt_publish(ex: RecordingExecutor) -> None:
    """Ctrl-C at every point of a request's publish; after each, a reader takes what is
    visible and LAP_CALLS calls must each return their own result."""
    inner = ex.executor

    def call() -> Any:
        return inner.collective_rpc("echo", args=(b"p",), timeout=10.0)

    points = ex.attempt("interrupt publish: its points", lambda: publish_points(call),
                        check="interrupt", expect_errors=OK) or []
    for i, point in enumerate(points):
        ex.attempt(f"interrupt publish at {point}", lambda p=point: cut_at(p, call),  # type: ignore[misc]
                   check="interrupt", expect_errors=OK)
        time.sleep(SETTLE_S)
        for k in range(LAP_CALLS):
            try:
                ex.collective_rpc("echo", args=(f"publish-{i}-{k}",), timeout=5.0,
                                  expect_errors=OK, check="interrupt")
            except Exception:  # noqa: BLE001 - recorded by the proxy, judged by the oracles
                break


interrupt_publish.needs_main_thread = True  # type: ignore[attr-defined]


def interrupt_once_visible(fault: Any, ctx: dict[str, Any]) -> None:
    """A failpoint action (queue.before_publish, in the driver): Ctrl-C as the writer next
    calls ``_published``, after a pause in which sleeping workers wake and take the chunk."""

    def on_call(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_name == "_published":
            sys.settrace(None)
            time.sleep(SETTLE_S)
            os.kill(os.getpid(), signal.SIGINT)  # raised here: the frame never runs

    sys.settrace(on_call)
