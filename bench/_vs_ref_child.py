"""One contestant of ``bench_vs_reference.py``, run in its own driver process.

    bench_vs_reference.py (parent)
      └─► python bench/_vs_ref_child.py SYSTEM QUICK ROOT   (faultlab, pipe, floors: .venv;
            │                                                reference: .venv-vllm)
            ├─ spawn 2 workers (SYSTEM's transport), echo round trips: small, 1 MiB, mixed,
            │  32 MiB; CPU of driver and workers from /proc/<pid>/task/*/schedstat
            └─► one JSON line on stdout: {metric: [samples]}

Stdlib and torch only at module level: the reference engine's interpreter runs this file
too, and it has no faultlab dependencies.  Every call checks its echo (type, length, ends),
so a wrong reply cannot pass as fast.  Random choices (the mixed workload's pauses and
sizes) come from one seeded ``random.Random``: every contestant gets the same sequence.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import pickle
import random
import sys
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

MiB = 1 << 20
SEED = 23
now = time.perf_counter
Call = Callable[[Any], list[Any]]


# --------------------------------------------------------------------------- measuring

def cpu_ns(pid: int) -> int:
    """CPU time (ns) of every thread of ``pid`` so far: schedstat is ns-exact, unlike ticks."""
    total = 0
    base = f"/proc/{pid}/task"
    for tid in os.listdir(base):
        try:
            with open(f"{base}/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            pass  # a thread that ended meanwhile
    return total


def minor_faults(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[7])  # field 10, minflt


def payload(kind: str) -> Any:
    if kind == "small":
        return (1, "two", 3.0)
    if kind == "1MiB":
        return os.urandom(MiB)
    import torch

    return torch.arange(32 * MiB // 4, dtype=torch.int32)


def check(kind: str, sent: Any, got: list[Any]) -> None:
    for g in got:
        if kind == "32MiB":
            ok = g.shape == sent.shape and int(g[-1]) == int(sent[-1]) and int(g[1]) == int(sent[1])
        elif kind == "1MiB":
            ok = type(g) is bytes and len(g) == len(sent) and g[-8:] == sent[-8:]
        else:
            ok = g == sent
        if not ok or len(got) != 2:
            raise AssertionError(f"wrong echo for the {kind} payload")


def timed(call: Call, kind: str, x: Any, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = now()
        got = call(x)
        out.append(now() - t0)
        check(kind, x, got)
    return out


def workloads(call: Call, pids: list[int], quick: bool) -> dict[str, list[float]]:
    """Every workload of the bench against one transport; ``pids``: its 2 workers."""
    small, mib, t32 = payload("small"), payload("1MiB"), payload("32MiB")
    n_small, n_mib, n_mixed, n_32 = (300, 40, 80, 3) if quick else (2000, 200, 400, 12)
    res: dict[str, list[float]] = {}
    timed(call, "small", small, n_small // 10)
    timed(call, "1MiB", mib, 10)
    timed(call, "32MiB", t32, 1)
    d0, w0 = cpu_ns(os.getpid()), [cpu_ns(p) for p in pids]
    res["small"] = timed(call, "small", small, n_small)
    d1, w1 = cpu_ns(os.getpid()), [cpu_ns(p) for p in pids]
    res["cpu_driver_per_rpc"] = [(d1 - d0) / 1e9 / n_small]
    res["cpu_worker_per_rpc"] = [(b - a) / 1e9 / n_small for a, b in zip(w0, w1, strict=True)]
    time.sleep(0.3 if quick else 2.0)  # the burst is over: how much do idle workers burn?
    w2 = [cpu_ns(p) for p in pids]
    res["idle_cpu_s"] = [(b - a) / 1e9 for a, b in zip(w1, w2, strict=True)]
    f0 = [minor_faults(p) for p in (os.getpid(), *pids)]
    res["1MiB"] = timed(call, "1MiB", mib, n_mib)
    f1 = [minor_faults(p) for p in (os.getpid(), *pids)]
    res["faults_driver_per_1MiB"] = [(f1[0] - f0[0]) / n_mib]
    res["faults_worker_per_1MiB"] = [(b - a) / n_mib for a, b in zip(f0[1:], f1[1:], strict=True)]
    res.update(mixed(call, small, mib, n_mixed))
    res["32MiB"] = timed(call, "32MiB", t32, n_32)
    return res


def mixed(call: Call, small: Any, mib: bytes, n: int) -> dict[str, list[float]]:
    """A pause of 0-2 ms before each call; one call in four is 1 MiB, the rest small."""
    rng = random.Random(SEED)
    out: dict[str, list[float]] = {"mixed_1MiB": [], "mixed_small": [], "faults_driver_per_mixed_1MiB": []}
    for _ in range(n):
        time.sleep(rng.uniform(0.0, 0.002))
        big = rng.random() < 0.25
        kind, x = ("1MiB", mib) if big else ("small", small)
        f0 = minor_faults(os.getpid())
        out["mixed_1MiB" if big else "mixed_small"] += timed(call, kind, x, 1)
        if big:
            out["faults_driver_per_mixed_1MiB"].append(minor_faults(os.getpid()) - f0)
    return out


# --------------------------------------------------------------------------- contestants

def run_faultlab(quick: bool) -> dict[str, list[float]]:
    import torch  # noqa: F401 - a model driver has torch imported

    from executor import ExecutorConfig, MultiprocExecutor

    cfg = ExecutorConfig(worker="executor.workers:EchoWorker", tensor_parallel_size=2,
                         start_method="spawn")
    with MultiprocExecutor(cfg) as ex:
        return workloads(lambda x: ex.collective_rpc("echo", args=(x,)), ex.worker_pids, quick)


def _pipe_echo(conn: Connection) -> None:
    """Bytes come back raw; anything else is unpickled and pickled again, as a worker would."""
    while True:
        raw = conn.recv_bytes()
        if not raw:
            return
        if raw[:1] == b"P":
            raw = b"P" + pickle.dumps(pickle.loads(memoryview(raw)[1:]), protocol=5)
        conn.send_bytes(raw)


def run_pipe(quick: bool) -> dict[str, list[float]]:
    ctx = mp.get_context("spawn")
    pairs = [ctx.Pipe(duplex=True) for _ in range(2)]
    procs = [ctx.Process(target=_pipe_echo, args=(theirs,), daemon=True) for _, theirs in pairs]
    for p in procs:
        p.start()
    conns = [mine for mine, _ in pairs]

    def call(x: Any) -> list[Any]:
        frame = b"B" + x if type(x) is bytes else b"P" + pickle.dumps(x, protocol=5)
        for c in conns:
            c.send_bytes(frame)
        out = []
        for c in conns:
            raw = c.recv_bytes()
            out.append(raw[1:] if raw[:1] == b"B" else pickle.loads(memoryview(raw)[1:]))
        return out

    try:
        return workloads(call, [p.pid for p in procs if p.pid is not None], quick)
    finally:
        for c in conns:
            c.send_bytes(b"")
        for p in procs:
            p.join(10)


def _ping_peer(down: Connection, up: Connection) -> None:
    rfd, wfd = down.fileno(), up.fileno()
    while os.read(rfd, 1) == b"\1":
        os.write(wfd, b"\1")


def run_floors(quick: bool) -> dict[str, list[float]]:
    """A 1-byte wake-up ping-pong to 2 spawned peers (raw pipes); memcpy of 1 and 32 MiB."""
    ctx = mp.get_context("spawn")
    ends, procs, keep = [], [], []
    for _ in range(2):
        (down_r, down_w), (up_r, up_w) = ctx.Pipe(duplex=False), ctx.Pipe(duplex=False)
        p = ctx.Process(target=_ping_peer, args=(down_r, up_w), daemon=True)
        p.start()
        down_r.close()
        up_w.close()
        keep += [down_w, up_r]
        ends.append((down_w.fileno(), up_r.fileno()))
        procs.append(p)
    res: dict[str, list[float]] = {"pingpong": []}
    try:
        for i in range(300 if quick else 2200):
            t0 = now()
            for w, _ in ends:
                os.write(w, b"\1")
            for _, r in ends:
                os.read(r, 1)
            if i >= 200:
                res["pingpong"].append(now() - t0)
    finally:
        for w, _ in ends:
            os.write(w, b"\0")
        for c in keep:
            c.close()
        for p in procs:
            p.join(10)
    for name, size, n in (("memcpy_1MiB", MiB, 200), ("memcpy_32MiB", 32 * MiB, 20)):
        src, dst = os.urandom(size), bytearray(size)
        view = memoryview(dst)
        res[name] = []
        for _ in range(n):
            t0 = now()
            view[:] = src
            res[name].append(now() - t0)
    return res


def main(system: str, quick: bool) -> dict[str, list[float]]:
    if system == "reference":
        from _ref_queue import run_reference

        return run_reference(quick, workloads)
    runs = {"faultlab": run_faultlab, "pipe": run_pipe, "floors": run_floors}
    return runs[system](quick)


if __name__ == "__main__":
    sys.path.insert(0, sys.argv[3])  # the faultlab tree under test (a before-tree, or ours)
    print(json.dumps(main(sys.argv[1], bool(int(sys.argv[2])))))
