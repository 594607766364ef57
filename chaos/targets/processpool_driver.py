"""The processpool target's driver (stdlib only besides the protocol module).

    python -m chaos.targets.processpool_driver SPEC_JSON

Start-up submits one task per worker that waits for the others (a barrier), so that all
``ranks`` workers exist before ``ready`` (the pool spawns them on demand); their pids in
order are the ranks.  A call submits one task per rank and waits for every one; the first
BrokenProcessPool is the ``error`` the caller saw, and each later call fails at once.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
import time
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from chaos.targets.protocol import Reporter, call_value

_barrier: Any = None


def _init(barrier: Any) -> None:
    global _barrier
    _barrier = barrier


def _meet() -> int:
    _barrier.wait(timeout=20)
    return os.getpid()


def work(call_id: int, rank: int, call_s: float) -> int:
    time.sleep(call_s)
    return call_value(call_id, rank)


def _start(ranks: int) -> tuple[ProcessPoolExecutor, list[int]]:
    barrier = multiprocessing.get_context().Barrier(ranks)
    pool = ProcessPoolExecutor(max_workers=ranks, initializer=_init, initargs=(barrier,))
    pids = sorted({f.result() for f in [pool.submit(_meet) for _ in range(ranks)]})
    return pool, pids


def _call(pool: ProcessPoolExecutor, i: int, ranks: int, call_s: float) -> list[int]:
    futures: list[Future[int]] = [pool.submit(work, i, r, call_s) for r in range(ranks)]
    return [f.result() for f in futures]


def main(spec_json: str) -> None:
    spec = json.loads(spec_json)
    report = Reporter()
    ranks, calls, call_s = int(spec["ranks"]), int(spec["calls"]), float(spec["call_s"])
    pool, pids = _start(ranks)
    report.ready([{"role": "driver", "rank": None, "pid": os.getpid()}]
                 + [{"role": "worker", "rank": r, "pid": pid} for r, pid in enumerate(pids)],
                 target="processpool")
    report.calls(calls, lambda i: _call(pool, i, ranks, call_s), BrokenProcessPool)
    time.sleep(float(spec.get("linger_s", 0.0)))
    pool.shutdown(wait=True)


if __name__ == "__main__":
    main(sys.argv[1])
