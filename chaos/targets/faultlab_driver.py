"""The faultlab target's driver: MultiprocExecutor running ``spec`` and reporting events.

    python -m chaos.targets.faultlab_driver SPEC_JSON   (see chaos.targets.faultlab_target)

Every call runs on every rank: sleep ``call_s``, return ``call_value(i, rank)``.  After an
``ExecutorFailedError`` the remaining calls are still made (each fails at once), so the
observer sees how every later call ends; after ``done`` the driver lingers ``linger_s``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from chaos.targets.base import WorkloadSpec
from chaos.targets.protocol import Reporter, call_value
from executor import ExecutorConfig, ExecutorFailedError, MultiprocExecutor


def work(worker: Any, call_id: int, call_s: float) -> int:
    time.sleep(call_s)
    return call_value(call_id, worker.rank)


def main(spec_json: str) -> None:
    spec = WorkloadSpec(**json.loads(spec_json))
    report = Reporter()
    cfg = ExecutorConfig(worker="executor.workers:EchoWorker", tensor_parallel_size=spec.ranks)
    with MultiprocExecutor(cfg) as ex:
        report.ready([{"role": "driver", "rank": None, "pid": os.getpid()}]
                     + [{"role": "worker", "rank": r, "pid": pid}
                        for r, pid in enumerate(ex.worker_pids)], target="faultlab")
        report.calls(spec.calls, lambda i: ex.collective_rpc(work, args=(i, spec.call_s)),
                     ExecutorFailedError)
        time.sleep(spec.linger_s)


if __name__ == "__main__":
    main(sys.argv[1])
