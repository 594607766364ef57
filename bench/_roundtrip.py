"""Large round trips (issue 14): payloads sent to 2 workers and echoed back, executor vs Pipe.

    parent (bench_executor.py --roundtrip)
      ├─► child driver: executor        ─┐  each system in its own driver process, so one's
      ├─► child driver: executor traced  ├─ allocator state never warms the other's; children
      └─► child driver: pipe            ─┘  run round-robin for several rounds (load drifts
          ◄── JSON samples on stdout        hit all alike); ratios compare pooled p50s

Each child times, for every case (small tuple, 64 KiB / 1 MiB / 8 MiB bytes and int32
tensors, 32 MiB tensor), two workloads:
- ``b2b``: the same case back to back, after a warm-up;
- ``mixed``: blocks of a few calls of each case in turn, with a pause between blocks (the
  allocator has time and reason to give memory back, as in a real driver);
- ``drop`` (the ``DROP_CASES``): back to back, but the caller drops every reply before the
  next call (in ``b2b`` and ``mixed`` the last reply checked lives on during the next call),
  which is when a driver's allocator gives large buffers back and takes them again.

Every call checks the echo (length, first and last bytes) so a wrong reply cannot pass as fast.
Each call also records the driver's minor page faults (``ru_minflt``), reported as a column:
the allocator's (or the receive pool's) warmth shows there.
"""

from __future__ import annotations

import json
import os
import pickle
import resource
import subprocess
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
KiB, MiB = 1 << 10, 1 << 20
now = time.perf_counter

# (name, kind, size): kind "small" | "bytes" | "tensor"
CASES = [("small", "small", 0), ("64KiB-bytes", "bytes", 64 * KiB), ("1MiB-bytes", "bytes", MiB),
         ("8MiB-bytes", "bytes", 8 * MiB), ("64KiB-tensor", "tensor", 64 * KiB),
         ("1MiB-tensor", "tensor", MiB), ("8MiB-tensor", "tensor", 8 * MiB),
         ("32MiB-tensor", "tensor", 32 * MiB)]
SYSTEMS = ("executor", "executor-traced", "pipe")
DROP_CASES = ("1MiB-bytes", "1MiB-tensor", "8MiB-tensor", "32MiB-tensor")


def _reps(size: int, quick: bool) -> tuple[int, int]:
    """(back-to-back calls, calls per mixed block) for a payload size."""
    b2b = 600 if size < MiB else 150 if size <= MiB else 40 if size <= 8 * MiB else 12
    block = 20 if size < MiB else 8 if size <= MiB else 3 if size <= 8 * MiB else 2
    return (max(4, b2b // 5), block) if quick else (b2b, block)


def payload(kind: str, size: int) -> Any:
    if kind == "small":
        return (1, "two", 3.0)
    if kind == "bytes":
        return os.urandom(size)
    import torch

    return torch.arange(size // 4, dtype=torch.int32)


def check(kind: str, sent: Any, got: Any) -> None:
    if kind == "tensor":
        ok = got.shape == sent.shape and int(got[-1]) == int(sent[-1]) and int(got[0]) == int(sent[0])
    elif kind == "bytes":
        ok = type(got) is bytes and len(got) == len(sent) and got[-8:] == sent[-8:]
    else:
        ok = got == sent
    if not ok:
        raise AssertionError(f"wrong echo for a {kind} payload")


# --------------------------------------------------------------------------- pipe baseline


def _pipe_echo_child(conn: Connection) -> None:
    """Echo every frame back as it came (bytes raw, everything else pickled by the parent)."""
    while True:
        try:
            raw = conn.recv_bytes()
        except (EOFError, OSError):
            return
        if not raw:
            return
        if raw[:1] == b"P":  # pickled: unpickle and pickle again, as a worker would
            raw = b"P" + pickle.dumps(pickle.loads(memoryview(raw)[1:]), protocol=5)
        conn.send_bytes(raw)


class PipeEcho:
    """Duplex Pipes to 2 forked processes; bytes travel raw, other values pickled."""

    def __init__(self, n: int = 2) -> None:
        from _stats import fork_pipe_peers

        self.conns, self.procs = fork_pipe_peers(_pipe_echo_child, n)

    def echo(self, x: Any) -> list[Any]:
        frame = b"B" + x if type(x) is bytes else b"P" + pickle.dumps(x, protocol=5)
        for c in self.conns:
            c.send_bytes(frame)
        out = []
        for c in self.conns:
            raw = c.recv_bytes()
            out.append(raw[1:] if raw[:1] == b"B" else pickle.loads(memoryview(raw)[1:]))
        return out

    def close(self) -> None:
        for c in self.conns:
            c.send_bytes(b"")
            c.close()
        for p in self.procs:
            p.join(5.0)


# --------------------------------------------------------------------------- one child driver


def _minflt() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _time_case(call: Any, kind: str, x: Any, n: int, faults: list[float] | None = None,
               drop: bool = False) -> list[float]:
    """``n`` timed calls; each call's driver page faults appended to ``faults``.  The last
    reply checked stays alive during the next call (``g``, as a caller's loop keeps it),
    unless ``drop``: then nothing of a reply outlives its check."""
    out = []
    for _ in range(n):
        f0, t0 = _minflt(), now()
        got = call(x)
        out.append(now() - t0)
        if faults is not None:
            faults.append(float(_minflt() - f0))
        for g in got:
            check(kind, x, g)
        del got
        if drop:
            del g
    return out


def child(system: str, quick: bool, pause: float) -> dict[str, dict[str, list[float]]]:
    import torch  # noqa: F401 - a model driver has torch imported (fork inherits it)

    from executor import ExecutorConfig, MultiprocExecutor

    payloads = {name: payload(kind, size) for name, kind, size in CASES}
    # workload -> case -> seconds per call; "<workload>-faults": the driver's minor page faults per call
    samples: dict[str, dict[str, list[float]]] = {
        "b2b": {}, "mixed": {}, "drop": {}, "b2b-faults": {}, "mixed-faults": {}, "drop-faults": {}}
    if system == "pipe":  # "executor-before" runs as "executor", from another tree
        pipes = PipeEcho()
        call, close = pipes.echo, pipes.close
    else:
        cfg = ExecutorConfig(worker="executor.workers:EchoWorker", tensor_parallel_size=2,
                             start_method="fork")
        ex = MultiprocExecutor(cfg)

        def call(x: Any) -> Any:
            return ex.collective_rpc("echo", args=(x,))

        close = ex.shutdown
    try:
        for name, kind, _size in CASES:  # mixed first: nothing warmed by a long b2b run yet
            _time_case(call, kind, payloads[name], 1)
        rounds = 3 if quick else 12
        for _ in range(rounds):
            for name, kind, size in CASES:
                block = _reps(size, quick)[1]
                time.sleep(pause)
                samples["mixed"].setdefault(name, []).extend(_time_case(
                    call, kind, payloads[name], block, samples["mixed-faults"].setdefault(name, [])))
        for name, kind, size in CASES:
            n = _reps(size, quick)[0]
            _time_case(call, kind, payloads[name], max(2, n // 10))
            samples["b2b-faults"][name] = []
            samples["b2b"][name] = _time_case(call, kind, payloads[name], n, samples["b2b-faults"][name])
        for name, kind, size in CASES:
            if name in DROP_CASES:
                n = _reps(size, quick)[0] // 2
                samples["drop-faults"][name] = []
                samples["drop"][name] = _time_case(
                    call, kind, payloads[name], n, samples["drop-faults"][name], drop=True)
    finally:
        close()
    return samples


def run_child(system: str, quick: bool, pause: float,
              before_tree: str | None = None) -> dict[str, dict[str, list[float]]]:
    """One child driver; ``executor-before`` imports the executor from ``before_tree``."""
    root = before_tree if system == "executor-before" and before_tree else str(ROOT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    with tempfile.TemporaryDirectory(prefix="faultlab-rt-") as trace_dir:
        if system == "executor-traced":
            env["FAULTLAB_TRACE_DIR"] = trace_dir
        else:
            env.pop("FAULTLAB_TRACE_DIR", None)
        args = [sys.executable, str(Path(__file__).resolve()), system, str(int(quick)), str(pause), root]
        out = subprocess.run(args, env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
    if out.returncode:
        raise RuntimeError(f"round-trip child {system} failed:\n{out.stderr[-3000:]}")
    result: dict[str, dict[str, list[float]]] = json.loads(out.stdout.splitlines()[-1])
    return result


def run_all(quick: bool, rounds: int | None = None, pause: float = 0.05,
            systems: tuple[str, ...] = SYSTEMS,
            before_tree: str | None = None) -> dict[str, dict[str, dict[str, list[float]]]]:
    """Pooled samples[system][workload][case] over round-robin rounds of child drivers.
    With ``before_tree`` (a checkout of an earlier version), its executor runs too, as
    ``executor-before``, interleaved with the others: a before/after in the same run."""
    pooled: dict[str, dict[str, dict[str, list[float]]]] = {}
    if before_tree:
        systems = (*systems, "executor-before")
    for r in range(rounds or (1 if quick else 3)):
        for system in systems[r % len(systems):] + systems[: r % len(systems)]:
            print(f"[roundtrip] round {r + 1}: {system} ...", file=sys.stderr, flush=True)
            got = run_child(system, quick, pause, before_tree)
            for workload, cases in got.items():
                for case, xs in cases.items():
                    pooled.setdefault(system, {}).setdefault(workload, {}).setdefault(case, []).extend(xs)
    return pooled



# --------------------------------------------------------------------------- report

TARGETS = {"1MiB-bytes": "≤ 0.5× Pipe p50"}


def _p50(xs: list[float]) -> float:
    from _stats import percentile

    return percentile(xs, 50)


def rows(pooled: dict[str, Any], before: dict[str, Any] | None = None) -> list[list[str]]:
    """One row per workload and case: executor (and traced) vs Pipe, and vs ``before``."""
    from _stats import fmt_ratio, fmt_time, percentile

    out = []
    for workload in ("b2b", "mixed", "drop"):
        for name, _kind, _size in CASES:
            if name not in pooled["executor"].get(workload, {}):
                continue
            ex = pooled["executor"][workload][name]
            pipe = _p50(pooled["pipe"][workload][name])
            traced = pooled.get("executor-traced", {}).get(workload, {}).get(name, [])
            old = before["executor"].get(workload, {}).get(name) if before else None
            if "executor-before" in pooled:  # measured in the same run: preferred
                old = pooled["executor-before"].get(workload, {}).get(name)
            faults = pooled["executor"].get(f"{workload}-faults", {}).get(name)
            row = [workload, name, fmt_time(_p50(ex)), fmt_time(percentile(ex, 99)),
                   fmt_ratio(_p50(ex) / pipe), fmt_time(_p50(traced)) if traced else "n/a",
                   fmt_time(pipe), f"{_p50(faults):.0f}" if faults else "n/a"]
            row += [fmt_time(_p50(old)), fmt_ratio(_p50(ex) / _p50(old))] if old else ["", ""]
            row.append(TARGETS.get(name, "≤ 0.5× before" if name == "32MiB-tensor" else ""))
            out.append(row)
    return out


HEADER = ["workload", "echo to 2 workers", "executor p50", "p99", "vs Pipe p50", "traced p50",
          "Pipe p50", "driver faults/call p50", "before p50", "vs before", "target (issue 14)"]

if __name__ == "__main__":
    sys.path.insert(0, sys.argv[4] if len(sys.argv) > 4 else str(ROOT))
    res = child(sys.argv[1], bool(int(sys.argv[2])), float(sys.argv[3]))
    print(json.dumps(res))
