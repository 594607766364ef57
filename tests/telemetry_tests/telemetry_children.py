"""Functions that run in child processes (importable, so spawn and forkserver can find them)."""

from __future__ import annotations

import os
import signal
import time

import telemetry
from telemetry import SpanContext


def record_and_die(n: int, how: str, rank: int, env: dict[str, str]) -> None:
    """Record ``n`` ended spans and one open span, then die by ``how`` (sigkill/exit)."""
    telemetry.configure_process("worker", rank, env=env)
    rec = telemetry.get_recorder()
    root = rec.start_span("worker.loop", attributes={"rank": rank})
    for i in range(n):
        span = rec.start_span("worker.execute", parent=root.context, attributes={"i": i})
        span.add_event("chaos.fault", {"fault": "none", "i": i})
        span.end()
    rec.start_span("worker.open", parent=root.context)
    if how == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(10)
    os._exit(3)


def serve_one_rpc(
    wire: tuple[int, int, int] | None, rank: int, env: dict[str, str] | None = None,
) -> None:
    """What a worker does for one message: dequeue, execute, enqueue, as children of ``wire``."""
    telemetry.configure_process("worker", rank, env=env)
    rec = telemetry.get_recorder()
    parent = SpanContext.from_wire(wire)
    dequeue = rec.start_span("worker.dequeue", parent=parent, attributes={"wait_ns": 1000})
    dequeue.end()
    execute = rec.start_span("echo", parent=parent, attributes={"rpc.method": "echo"})
    enqueue = rec.start_span("worker.reply.enqueue", parent=execute.context)
    enqueue.end()
    execute.end()
    rec.event("worker.exit", {"rank": rank}, parent=parent)
    telemetry.shutdown()


def run_as_second_driver(env: dict[str, str]) -> None:
    """A driver launched by another traced process (as chaos launches one) in the same dir."""
    telemetry.configure_process("driver", env=env)
    telemetry.get_recorder().start_span("second.driver").end()
    telemetry.shutdown()
