"""The reference engine's own shared-memory queues, wired as its multiprocess executor wires them.

    driver ── broadcast MessageQueue (2 readers, 16 MiB x 10 chunks) ──► worker 0, worker 1
    driver ◄── reply MessageQueue (1 reader, its defaults), one per worker, created by the worker

A worker serves ``(method, args, kwargs, output_rank)`` requests from the broadcast queue
and answers ``(status, value)`` on its reply queue, as the engine's worker busy loop does;
a request whose pickle does not fit a chunk takes the queue's own zmq side path.  Runs
only in the reference engine's interpreter (``.venv-vllm``); imported lazily by
``_vs_ref_child.py`` so that faultlab's interpreter never needs it.
"""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

BROADCAST_CHUNK_BYTES = 16 << 20
BROADCAST_CHUNKS = 10
SUCCESS = 0


def _worker(handle: Any, rank: int, conn: Connection) -> None:
    from vllm.distributed.device_communicators.shm_broadcast import MessageQueue

    requests = MessageQueue.create_from_handle(handle, rank)
    replies = MessageQueue(1, 1)
    conn.send(replies.export_handle())
    requests.wait_until_ready()
    replies.wait_until_ready()
    while True:
        method, args, _kwargs, _output_rank = requests.dequeue(indefinite=True)
        if method == "stop":
            return
        replies.enqueue((SUCCESS, args[0]))


def run_reference(quick: bool, workloads: Callable[..., dict[str, list[float]]]) -> dict[str, list[float]]:
    from vllm.distributed.device_communicators.shm_broadcast import MessageQueue

    ctx = mp.get_context("spawn")
    requests = MessageQueue(2, 2, max_chunk_bytes=BROADCAST_CHUNK_BYTES, max_chunks=BROADCAST_CHUNKS)
    pipes = [ctx.Pipe() for _ in range(2)]
    procs = [ctx.Process(target=_worker, args=(requests.export_handle(), rank, pipes[rank][1]),
                         daemon=True) for rank in range(2)]
    for p in procs:
        p.start()
    replies = [MessageQueue.create_from_handle(mine.recv(), 0) for mine, _ in pipes]
    requests.wait_until_ready()
    for q in replies:
        q.wait_until_ready()

    def call(x: Any) -> list[Any]:
        requests.enqueue(("echo", (x,), {}, None))
        out = []
        for q in replies:
            status, value = q.dequeue(timeout=60)
            if status != SUCCESS:
                raise RuntimeError(f"reference worker failed: {value!r}")
            out.append(value)
        return out

    try:
        return workloads(call, [p.pid for p in procs if p.pid is not None], quick)
    finally:
        requests.enqueue(("stop", (), {}, None))
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
