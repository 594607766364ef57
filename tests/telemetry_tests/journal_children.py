"""Traced programs for the journal tests, run as fresh interpreters (the journal's segment
size, ``FAULTLAB_JOURNAL_SEGMENT_BYTES``, is read at import).

    python journal_children.py spans N         record N spans, one thread; fds, maps
    python journal_children.py rpcs N          N traced echo RPCs on a TP=2 executor

Each prints one JSON line: the process's fd count and number of journal mappings after
every ``N // SAMPLES`` spans or RPCs (for ``rpcs``: the workers' fd counts too), how
many calls succeeded and, with ``LOAD_RUN_HERE`` set, how many spans ``load_run`` reads.
Tracing warnings go to stderr through logging's default handler.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import psutil

import telemetry

SAMPLES = 10


def fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def journal_maps() -> int:
    with open("/proc/self/maps") as f:
        return sum("/journal-" in line for line in f)


def record_spans(n: int) -> dict[str, Any]:
    telemetry.configure_process("driver")
    rec = telemetry.get_recorder()
    samples = []
    for i in range(n):
        with rec.start_span("filler", attributes={"i": i}) as span:
            span.add_event("tick", {"i": i})
        if (i + 1) % (n // SAMPLES) == 0:
            samples.append({"fds": fds(), "maps": journal_maps()})
    telemetry.shutdown()
    return {"samples": samples}


def traced_rpcs(n: int) -> dict[str, Any]:
    from executor import ExecutorConfig, MultiprocExecutor

    telemetry.configure_process("driver")
    ex = MultiprocExecutor(ExecutorConfig(tensor_parallel_size=2))
    workers = [psutil.Process(pid) for pid in ex.worker_pids]
    samples, ok = [], 0
    try:
        for i in range(n):
            ok += ex.collective_rpc("echo", args=(i,), timeout=30) == [i, i]
            if (i + 1) % (n // SAMPLES) == 0:
                samples.append({"fds": fds(), "maps": journal_maps(),
                                "worker_fds": [w.num_fds() for w in workers]})
    finally:
        ex.shutdown()
        telemetry.shutdown()
    return {"samples": samples, "ok": ok}


def main(mode: str, n: int) -> int:
    out = record_spans(n) if mode == "spans" else traced_rpcs(n)
    if os.environ.get("LOAD_RUN_HERE"):  # the run directory does not outlive this process
        out["recorded"] = len(telemetry.load_run(os.environ["FAULTLAB_TRACE_DIR"]))
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2])))
