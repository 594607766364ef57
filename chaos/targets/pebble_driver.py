"""The pebble target's driver: the peer workload on ``pebble.ProcessPool``.

    driver ── ProcessPool(max_workers=ranks) ──► n forked workers (multiprocessing children)
       (three threads in the driver: task scheduler, pool manager, message manager; the pool
        manager replaces a worker that died and fails the task it held with ProcessExpired)

Tasks cannot be pinned to a worker: "one task per rank" is ``ranks`` tasks in flight at
once.  Workers are ranked in pid order.  No helper processes, no named segments.

Observed (pebble 5.2.3, two shared cores): ready after ~0.3 s; a worker's SIGKILL or SIGTERM
fails the task it held with ProcessExpired("Abnormal termination") within ~0.1 s (the pool
manager polls; the exception's ``pid`` and ``exitcode`` are set, its message names neither),
the worker is replaced and later calls succeed; a SIGSTOPped worker is waited for without
end, no error; after the driver's SIGKILL the workers go within ~0.3 s; nothing is left.

    python -m chaos.targets.pebble_driver SPEC_JSON
"""

from __future__ import annotations

import multiprocessing
import sys
import time
from importlib.metadata import version

import pebble
import psutil

from chaos.targets import peer_workload as pw
from chaos.targets.base import WorkloadSpec
from chaos.targets.protocol import Reporter

WARM_UP_HOLD_S = 0.3


def run_call(pool: pebble.ProcessPool, spec: WorkloadSpec, index: int) -> list[int]:
    futures = [pool.schedule(pw.sleep_task, args=(index, rank, spec.call_s))
               for rank in range(spec.ranks)]
    return pw.gather(futures, pw.call_timeout_s(spec), "pebble")


def warm_up(pool: pebble.ProcessPool, spec: WorkloadSpec) -> list[int]:
    """Start every worker (pebble starts them on the first schedule); their pids in order."""
    for future in [pool.schedule(pw.pid_task, args=(WARM_UP_HOLD_S,)) for _ in range(spec.ranks)]:
        future.result(timeout=pw.call_timeout_s(spec))
    return sorted(p.pid for p in multiprocessing.active_children() if p.pid is not None)


def role_of(proc: psutil.Process) -> str:
    return "helper"


def main(argv: list[str]) -> int:
    started = time.monotonic()
    spec = pw.load_spec(argv)
    reporter = Reporter()
    pool = pebble.ProcessPool(max_workers=spec.ranks)
    worker_pids = warm_up(pool, spec)
    tree = pw.process_tree(worker_pids, pw.descendants(), role_of)
    pw.report_ready(reporter, tree, started, executor="pebble", version=version("pebble"))
    pw.run_calls(spec, reporter, lambda index: run_call(pool, spec, index))
    reporter.done()
    pw.linger(spec)
    pool.close()  # type: ignore[no-untyped-call]
    pool.join()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
