"""A driver process for the parent-death property: run calls, then wait to be SIGKILLed.

    python driver_child.py '{"start_method": ..., "calls": [...], "phase": ...}'

It prints ``started <pids>`` once its executor is up, then ``kill-me`` at the moment the
parent should SIGKILL it, and then blocks (idle, with futures pending, inside a blocking
call, or with workers busy in a long sleep).  ``phase = "startup"`` says ``kill-me`` before
the executor exists, so the kill lands somewhere inside start-up.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from chaos.strategies import unique_args
from chaos.workloads import CallSpec
from executor import ExecutorConfig, ExecutorError, MultiprocExecutor

LONG_S = 60.0  # longer than any test waits: the kill always lands first


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def run_calls(ex: MultiprocExecutor, calls: list[CallSpec]) -> list[Any]:
    futures = []
    for i, spec in enumerate(calls):
        try:
            out = ex.collective_rpc(spec.method, timeout=spec.timeout, args=unique_args(spec, i),
                                    non_block=spec.non_block, unique_reply_rank=spec.unique_reply_rank)
        except (ExecutorError, TimeoutError):
            continue
        if spec.non_block:
            futures.append(out)
    return futures


def main(spec: dict[str, Any]) -> None:
    cfg = ExecutorConfig(tensor_parallel_size=2, start_method=spec["start_method"])
    phase = spec["phase"]
    if phase == "startup":
        say("kill-me")
    ex = MultiprocExecutor(cfg)
    say("started " + json.dumps(ex.worker_pids))
    futures = run_calls(ex, [CallSpec(**c) for c in spec["calls"]])
    if phase == "idle":
        for f in futures:
            f.exception()
    elif phase == "busy":
        ex.collective_rpc("sleep", args=(LONG_S,), non_block=True)
    if phase != "startup":
        say("kill-me")
    if phase == "blocking":
        ex.collective_rpc("sleep", args=(LONG_S,))
    time.sleep(LONG_S)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
