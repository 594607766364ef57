"""A short user script with live export on, run as its own interpreter by test_live_export_exit.

``python live_exit_script.py MODE``: start a real 2-worker executor, then

- ``normal``: 3 echo RPCs, fall off the end of the script;
- ``exit``: 3 echo RPCs, ``sys.exit(3)``;
- ``raise``: 3 echo RPCs, an uncaught ``RuntimeError``;
- ``kill``: rank 1 is SIGKILLed while it executes ``sleep``; the failed call is caught and
  the script ends normally, leaving the killed worker's execute span open (truncated);
- ``finalizer``: like ``normal``, but another ``weakref.finalize`` (a temporary directory)
  exists before the executor and the recorder, so the interpreter's finalizer hook is
  registered before telemetry first runs;
- ``bare``: no executor, one span (for an unreachable collector).

The script never calls ``telemetry.shutdown()``: the flush at interpreter exit is under test.
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import time

import telemetry
from executor import ExecutorConfig, ExecutorError, MultiprocExecutor
from telemetry.assemble import read_run

RPCS = 3


def wait_until_executing(method: str, rank: int, deadline_s: float = 30.0) -> None:
    """Poll the journals until ``rank`` has an open ``worker.execute <method>`` span."""
    run_dir = telemetry.get_recorder().run_dir
    assert run_dir is not None, "tracing is off"
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        for span in read_run(run_dir):
            if (span.name == f"worker.execute {method}" and span.process.rank == rank
                    and span.end_ns is None):
                return
        time.sleep(0.02)
    raise TimeoutError(f"rank {rank} never started executing {method}")


def kill_mid_call(ex: MultiprocExecutor) -> None:
    pids = ex.collective_rpc("getpid")
    future = ex.collective_rpc("sleep", args=(30.0,), non_block=True)
    wait_until_executing("sleep", rank=1)
    os.kill(pids[1], signal.SIGKILL)
    try:
        future.result(timeout=30)
    except ExecutorError as exc:  # the executor reports the death; the script goes on
        print(f"sleep failed: {type(exc).__name__}", file=sys.stderr)
    else:
        raise AssertionError("the call on a killed worker succeeded")


def main(mode: str) -> None:
    if mode == "bare":
        telemetry.get_recorder().start_span("bare").end()
        return
    if mode == "finalizer":
        scratch = tempfile.TemporaryDirectory()  # cleaned by its finalizer at exit
        assert scratch.name
    ex = MultiprocExecutor(ExecutorConfig(tensor_parallel_size=2))
    if mode == "kill":
        kill_mid_call(ex)
        return
    for i in range(RPCS):
        assert ex.collective_rpc("echo", args=(i,)) == [i, i]
    if mode == "exit":
        sys.exit(3)
    if mode == "raise":
        raise RuntimeError("uncaught on purpose")


if __name__ == "__main__":
    main(sys.argv[1])
