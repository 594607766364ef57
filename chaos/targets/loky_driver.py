"""The loky target's driver: the peer workload on loky's reusable executor.

    driver ── get_reusable_executor(max_workers=ranks) ──► LokyProcess-1..n (workers)
       │        (asked again for every call: after a crash loky hands back a new one)
       ├── loky resource tracker        (role loky_resource_tracker)
       └── multiprocessing resource tracker (role mp_resource_tracker)

Tasks cannot be pinned to a worker: "one task per rank" is ``ranks`` tasks in flight at
once.  Workers are ranked in pid order.  loky names its semaphores ``/dev/shm/sem.loky-<pid>-*``;
they are reported in ``ready`` as ``shm``.

Observed (loky 3.7.0, two shared cores): ready after ~1 s; a worker's SIGKILL or SIGTERM is
TerminatedWorkerError within ~0.1 s, naming the signal ("exit codes of the workers are
{SIGKILL(-9)}") but not the worker; the next call gets a new executor (~1 s to respawn) and
succeeds; a SIGSTOPped worker is waited for without end, no error; after the driver's SIGKILL
(idle or busy) the workers and both resource trackers live ~40 s more (the 10 s idle timeout,
then up to 30 s on the worker exit lock), then the loky tracker unlinks the semaphores, with
a warning: killed earlier, it leaves them in /dev/shm.

    python -m chaos.targets.loky_driver SPEC_JSON
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import loky
import psutil

from chaos.targets import peer_workload as pw
from chaos.targets.base import WorkloadSpec
from chaos.targets.protocol import Reporter

# loky's own default idle timeout is kept (10 s: idle workers leave, the next submit starts
# them again); it is also what ends them once their driver is gone.
WARM_UP_HOLD_S = 0.3


def executor(spec: WorkloadSpec) -> Any:
    return loky.get_reusable_executor(max_workers=spec.ranks)


def run_call(spec: WorkloadSpec, index: int) -> list[int]:
    pool = executor(spec)
    futures = [pool.submit(pw.sleep_task, index, rank, spec.call_s) for rank in range(spec.ranks)]
    return pw.gather(futures, pw.call_timeout_s(spec), "loky")


def warm_up(spec: WorkloadSpec) -> list[int]:
    """Start every worker; their pids in order (loky starts them all on the first submit)."""
    pool = executor(spec)
    for future in [pool.submit(pw.pid_task, WARM_UP_HOLD_S) for _ in range(spec.ranks)]:
        future.result(timeout=pw.call_timeout_s(spec))
    deadline = time.monotonic() + pw.call_timeout_s(spec)
    while len(workers()) < spec.ranks and time.monotonic() < deadline:
        time.sleep(0.02)
    return sorted(p.pid for p in workers())


def workers() -> list[psutil.Process]:
    return [p for p in pw.descendants() if "popen_loky_posix" in pw.cmdline_text(p)]


def role_of(proc: psutil.Process) -> str:
    cmd = pw.cmdline_text(proc)
    if "loky.backend.resource_tracker" in cmd:
        return "loky_resource_tracker"
    if "multiprocessing.resource_tracker" in cmd:
        return "mp_resource_tracker"
    return "helper"


def shm_names() -> list[str]:
    prefix = f"sem.loky-{os.getpid()}-"
    try:
        return sorted(n for n in os.listdir("/dev/shm") if n.startswith(prefix))
    except OSError:
        return []


def main(argv: list[str]) -> int:
    started = time.monotonic()
    spec = pw.load_spec(argv)
    reporter = Reporter()
    worker_pids = warm_up(spec)
    tree = pw.process_tree(worker_pids, pw.descendants(), role_of)
    pw.report_ready(reporter, tree, started, executor="loky", version=loky.__version__,
                    shm=shm_names())
    pw.run_calls(spec, reporter, lambda index: run_call(spec, index))
    reporter.done()
    pw.linger(spec)
    executor(spec).shutdown(wait=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
