"""Executor benchmark: faultlab's MultiprocExecutor side by side with Pipe and ProcessPoolExecutor.

    python bench/bench_executor.py                 # full run (a few minutes); writes the
                                                   #   "## Executor" section of bench/RESULTS.md
    python bench/bench_executor.py --quick         # sanity run (< ~1 min); prints only, unless --out

    section                      executor (2 EchoWorkers)              baseline, same run
    1 small broadcast RPC        collective_rpc("echo", 64 B)          Pipe ping-pong ×2, ProcessPool(2)
    2 1 MiB / 32 MiB one-way     collective_rpc("nbytes", bytes|tensor) Pipe send_bytes ×2, tiny ack
    3 worker SIGKILL → error     blocking sleep(10) in a thread        —
    4 driver SIGKILL → gone      `python -c` driver, idle | busy       —
    5 idle worker CPU, wake-up   psutil cpu_times over ~3 s idle       —
    6 start-up / shutdown        fork, forkserver, spawn               —

    python bench/bench_executor.py --roundtrip     # only the large round trips (issue 14), see
                                                   #   bench/_roundtrip.py; writes "## Large round trips"

Timed loops of the executor and of its baselines run interleaved in small blocks, so that load
from other processes on a shared machine hits both alike; ratios compare p50s of one run.
Every process and /dev/shm segment the run creates is gone when it ends (checked and reported).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import ctypes
import dataclasses
import json
import logging
import math
import multiprocessing as mp
import os
import pickle
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import psutil

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for _p in (str(HERE), str(ROOT)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from _stats import (  # noqa: E402
    Summary,
    fmt_ratio,
    fmt_time,
    fork_pipe_peers,
    machine,
    markdown_table,
    text_table,
    write_section,
)

from executor import ExecutorConfig, ExecutorFailedError, MultiprocExecutor  # noqa: E402
from executor.waiting import WaitPolicy  # noqa: E402 - internal, for the diagnostic variant

ECHO = "executor.workers:EchoWorker"
SMALL_PAYLOAD = b"x" * 64
MiB = 1 << 20
now = time.perf_counter


@dataclasses.dataclass(frozen=True)
class Plan:
    small_calls: int = 3000  # timed calls per system (after warm-up)
    small_warmup: int = 300
    mib1_reps: int = 300
    mib32_reps: int = 40
    kill_reps: int = 20
    driver_reps: int = 10  # per case (idle, busy)
    idle_s: float = 3.0
    wake_reps: int = 10
    start_reps: int = 5  # per start method


FULL = Plan()
QUICK = Plan(small_calls=500, small_warmup=100, mib1_reps=40, mib32_reps=6, kill_reps=5,
             driver_reps=3, idle_s=3.0, wake_reps=3, start_reps=2)


def config(start_method: str = "fork", **kw: Any) -> ExecutorConfig:
    return ExecutorConfig(worker=ECHO, tensor_parallel_size=2, start_method=start_method, **kw)


# Diagnostic variants timed beside the default executor (informational rows, no targets):
# the payload checksum off, and waiters that block at once instead of spinning then yielding.
BLOCK_ONLY = WaitPolicy(spin_s=0.0, yield_s=0.0)
VARIANTS = {"no_checksum": "executor, checksum=False", "block_only": "executor, block-only wait"}


# --------------------------------------------------------------------------- baselines


def _pipe_child(conn: Connection) -> None:
    """A baseline 'worker': pickled (cmd, arg) messages, or raw frames in bytes/tensor mode."""
    mode = "obj"
    while True:
        try:
            raw = conn.recv_bytes()
        except (EOFError, OSError):
            return
        if mode == "obj":
            cmd, arg = pickle.loads(raw)
            if cmd == "quit":
                return
            if cmd == "mode":
                mode = arg
            conn.send(arg)  # "echo" answers with its argument
        elif not raw:  # an empty frame ends bytes/tensor mode
            mode = "obj"
            conn.send("obj")
        elif mode == "bytes":
            conn.send(len(raw))
        else:
            conn.send(pickle.loads(raw).nbytes)


class PipeWorkers:
    """Two processes at the far end of duplex Pipes: send to both, then receive from both."""

    def __init__(self, n: int = 2) -> None:
        self.conns, self.procs = fork_pipe_peers(_pipe_child, n)

    def call(self, cmd: str, arg: Any) -> list[Any]:
        for c in self.conns:
            c.send((cmd, arg))
        return [c.recv() for c in self.conns]

    def send_frame(self, frame: bytes) -> list[Any]:
        for c in self.conns:
            c.send_bytes(frame)
        return [c.recv() for c in self.conns]

    def close(self) -> None:
        for c in self.conns:
            with contextlib.suppress(OSError):
                c.send(("quit", None))
            c.close()
        for p in self.procs:
            p.join(2.0)
            if p.is_alive():
                p.kill()
                p.join(2.0)


def _ppe_echo(x: Any) -> Any:
    return x


# --------------------------------------------------------------------------- timing


def interleaved(runners: dict[str, Callable[[], Any]], total: int, block: int,
                warmup: int) -> dict[str, list[float]]:
    """Time ``total`` calls of every runner, alternating runners every ``block`` calls."""
    for fn in runners.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in runners}
    order = list(runners)
    done = 0
    while done < total:
        n = min(block, total - done)
        for name in order:
            fn, out = runners[name], samples[name]
            for _ in range(n):
                t0 = now()
                fn()
                out.append(now() - t0)
        order.append(order.pop(0))  # rotate, so no runner always follows the same one
        done += n
    return samples


@contextlib.contextmanager
def pipe_mode(pipes: PipeWorkers, mode: str) -> Iterator[None]:
    pipes.call("mode", mode)
    try:
        yield
    finally:
        pipes.send_frame(b"")


# --------------------------------------------------------------------------- 1 and 2


def _rpc(ex: MultiprocExecutor, method: str, arg: Any) -> Callable[[], Any]:
    return lambda: ex.collective_rpc(method, args=(arg,))


def bench_small(plan: Plan, exs: dict[str, MultiprocExecutor], pipes: PipeWorkers,
                pool: cf.ProcessPoolExecutor) -> dict[str, Summary]:
    expected = [SMALL_PAYLOAD, SMALL_PAYLOAD]
    for ex in exs.values():
        assert ex.collective_rpc("echo", args=(SMALL_PAYLOAD,)) == expected
    assert pipes.call("echo", SMALL_PAYLOAD) == expected

    def pool_call() -> None:
        futures = [pool.submit(_ppe_echo, SMALL_PAYLOAD) for _ in range(2)]
        for f in futures:
            f.result()

    runners = {name: _rpc(ex, "echo", SMALL_PAYLOAD) for name, ex in exs.items()}
    runners["pipe"] = lambda: pipes.call("echo", SMALL_PAYLOAD)
    runners["pool"] = pool_call
    samples = interleaved(runners, plan.small_calls, 100, plan.small_warmup)
    return {k: Summary.of(v) for k, v in samples.items()}


def _tensor(size: int) -> Any:
    import torch

    return torch.arange(size // 4, dtype=torch.int32)


def bench_payload(plan: Plan, exs: dict[str, MultiprocExecutor], pipes: PipeWorkers, size: int,
                  kind: str) -> dict[str, Summary]:
    payload: Any = os.urandom(size) if kind == "bytes" else _tensor(size)
    for ex in exs.values():
        assert ex.collective_rpc("nbytes", args=(payload,)) == [size, size]
    if kind == "bytes":
        def pipe_call() -> None:
            pipes.send_frame(payload)
    else:
        def pipe_call() -> None:
            pipes.send_frame(pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL))
    reps = plan.mib1_reps if size <= MiB else plan.mib32_reps
    with pipe_mode(pipes, kind):
        pipe_call()
        runners = {name: _rpc(ex, "nbytes", payload) for name, ex in exs.items()}
        runners["pipe"] = pipe_call
        samples = interleaved(runners, reps, max(2, reps // 10), 3)
    return {k: Summary.of(v) for k, v in samples.items()}


def bench_throughput(plan: Plan) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        pipes = PipeWorkers()
        stack.callback(pipes.close)
        exs = {
            "executor": stack.enter_context(MultiprocExecutor(config("fork"))),
            "no_checksum": stack.enter_context(MultiprocExecutor(config("fork", checksum=False))),
            "block_only": stack.enter_context(
                MultiprocExecutor(config("fork"), wait_policy=BLOCK_ONLY)),
        }
        pool = stack.enter_context(cf.ProcessPoolExecutor(2, mp_context=mp.get_context("fork")))
        out["small"] = bench_small(plan, exs, pipes, pool)
        for size in (MiB, 32 * MiB):
            for kind in ("bytes", "tensor"):
                out[f"{size // MiB}MiB-{kind}"] = bench_payload(plan, exs, pipes, size, kind)
    return out


# --------------------------------------------------------------------------- 3


def kill_once(rank: int, start_method: str) -> tuple[float, float, str]:
    """(SIGKILL of one worker → its pidfd readable, → ExecutorFailedError in a blocked caller)."""
    caught: dict[str, Any] = {}

    def blocked_call(ex: MultiprocExecutor) -> None:
        try:
            ex.collective_rpc("sleep", args=(10.0,))
            caught["t"], caught["msg"] = now(), "no error: the call returned"
        except BaseException as exc:  # noqa: BLE001 - any other outcome is reported
            caught["t"] = now()
            caught["msg"] = str(exc) if isinstance(exc, ExecutorFailedError) else repr(exc)
            caught["ok"] = isinstance(exc, ExecutorFailedError)

    with MultiprocExecutor(config(start_method)) as ex:
        ex.collective_rpc("echo", args=(b"warm",))
        thread = threading.Thread(target=blocked_call, args=(ex,), daemon=True)
        thread.start()
        time.sleep(0.15)  # both workers are inside sleep(10), the caller blocked on replies
        pidfd = os.pidfd_open(ex.worker_pids[rank])
        try:
            t0 = now()
            os.kill(ex.worker_pids[rank], signal.SIGKILL)
            select.select([pidfd], [], [], 10.0)  # readable once the kernel has torn it down
            t_exit = now()
        finally:
            os.close(pidfd)
        thread.join(15.0)
    if not caught.get("ok"):
        raise RuntimeError(f"SIGKILL of rank {rank}: {caught.get('msg', 'caller still blocked')}")
    return t_exit - t0, caught["t"] - t0, caught["msg"]


def bench_kill(plan: Plan) -> dict[str, Any]:
    """Fork workers share the driver's (torch-sized) address space; spawn workers do not."""
    out: dict[str, Any] = {}
    logger = logging.getLogger("executor")
    level = logger.level
    logger.setLevel(logging.CRITICAL)  # each kill logs 'executor failed' at ERROR: expected here
    try:
        for method, reps in (("fork", plan.kill_reps), ("spawn", max(2, plan.kill_reps // 2))):
            exits, errors = [], []
            for i in range(reps):
                t_exit, t_error, out["message"] = kill_once(i % 2, method)
                exits.append(t_exit)
                errors.append(t_error)
            out[method] = {"exit": Summary.of(exits), "error": Summary.of(errors)}
    finally:
        logger.setLevel(level)
    return out


# --------------------------------------------------------------------------- 4

DRIVER_SCRIPT = r"""
import sys, time
from executor import ExecutorConfig, MultiprocExecutor
mode, method = sys.argv[1], sys.argv[2]
ex = MultiprocExecutor(ExecutorConfig(worker="executor.workers:EchoWorker",
                                      tensor_parallel_size=2, start_method=method))
ex.collective_rpc("echo", args=(b"x",))
if mode == "busy":
    pending = ex.collective_rpc("sleep", args=(600.0,), non_block=True)
    time.sleep(0.2)  # both workers are inside sleep(600)
print(" ".join(map(str, ex.worker_pids)), flush=True)
time.sleep(600)
"""


def _set_child_subreaper() -> None:
    """Adopt orphaned descendants, so that exited workers are our zombies to see and reap."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


def _gone(p: psutil.Process) -> bool:
    try:
        return not p.is_running() or p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _reap(p: psutil.Process) -> None:
    """Make sure a worker of a killed driver is dead and reaped (it may be our child now)."""
    with contextlib.suppress(psutil.Error):
        if not _gone(p):
            p.kill()
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(p.pid, 0)


def _read_pids(proc: subprocess.Popen[str], timeout: float = 120.0) -> list[int]:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    line = proc.stdout.readline() if ready else ""
    if not line.strip():
        raise RuntimeError(f"driver printed no worker pids (exit code {proc.poll()})")
    return [int(x) for x in line.split()]


def driver_death_once(mode: str, leaked: list[str]) -> float:
    """Seconds from SIGKILL of a driver to the moment all its workers have exited."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", DRIVER_SCRIPT, mode, "fork"], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, text=True)
    workers: list[psutil.Process] = []
    try:
        workers = [psutil.Process(pid) for pid in _read_pids(proc)]
        t0 = now()
        os.kill(proc.pid, signal.SIGKILL)
        deadline = t0 + 5.0
        while not all(_gone(p) for p in workers) and now() < deadline:
            time.sleep(0.0002)
        t1 = now()
        return t1 - t0 if all(_gone(p) for p in workers) else math.inf
    finally:
        proc.kill()
        proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()
        for p in workers:
            _reap(p)
        leaked += _sweep_segments(proc.pid)


def bench_driver_death(plan: Plan) -> dict[str, Any]:
    _set_child_subreaper()
    out: dict[str, Any] = {"leaked": []}
    for mode in ("idle", "busy"):
        samples = [driver_death_once(mode, out["leaked"]) for _ in range(plan.driver_reps)]
        out[mode] = Summary.of(samples)
        out[f"{mode}_missed"] = sum(math.isinf(s) for s in samples)
    return out


# --------------------------------------------------------------------------- 5


def _cpu_seconds(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system


def _sched_ns(pid: int) -> int:
    """On-CPU nanoseconds of every thread of ``pid`` (finer than psutil's clock ticks)."""
    total = 0
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
    return total


def bench_idle(plan: Plan) -> dict[str, Any]:
    with MultiprocExecutor(config("fork")) as ex:
        for _ in range(200):
            ex.collective_rpc("echo", args=(SMALL_PAYLOAD,))
        procs = [psutil.Process(pid) for pid in ex.worker_pids]
        me = psutil.Process()
        c0 = [_cpu_seconds(p) for p in procs]
        s0 = [_sched_ns(p.pid) for p in procs]
        d0, t0 = _cpu_seconds(me), now()
        time.sleep(plan.idle_s)
        wall = now() - t0
        c1 = [_cpu_seconds(p) for p in procs]
        s1 = [_sched_ns(p.pid) for p in procs]
        d1 = _cpu_seconds(me)
        wake = []
        for _ in range(plan.wake_reps):
            t = now()
            ex.collective_rpc("echo", args=(SMALL_PAYLOAD,))
            wake.append(now() - t)
            time.sleep(0.4)  # past the spin and yield phases, into the blocking wait
    pct = [100 * (b - a) / wall for a, b in zip(c0, c1, strict=True)]
    sched_pct = [100 * (b - a) / 1e9 / wall for a, b in zip(s0, s1, strict=True)]
    return {"worker_pct": pct, "worker_sched_pct": sched_pct,
            "driver_pct": 100 * (d1 - d0) / wall, "wall": wall, "wake": Summary.of(wake)}


# --------------------------------------------------------------------------- 6


def bench_startup(plan: Plan) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for method in ("fork", "forkserver", "spawn"):
        starts, stops = [], []
        for _ in range(plan.start_reps):
            t0 = now()
            ex = MultiprocExecutor(config(method))
            try:
                t1 = now()
                assert ex.collective_rpc("get_rank") == [0, 1]
            finally:
                t2 = now()
                ex.shutdown()
                t3 = now()
            starts.append(t1 - t0)
            stops.append(t3 - t2)
        out[method] = {"start": Summary.of(starts), "first": starts[0], "stop": Summary.of(stops)}
    return out


# --------------------------------------------------------------------------- leaks


def _sweep_segments(owner_pid: int) -> list[str]:
    """Unlink and return the faultlab /dev/shm segments that ``owner_pid`` left behind."""
    from executor import shm

    prefix = f"{shm.PREFIX}{owner_pid}_"
    try:
        names = [n for n in os.listdir(shm.SHM_DIR) if n.startswith(prefix)]
    except FileNotFoundError:
        return []
    for name in names:
        shm.unlink(name)
    return names


def _stop_mp_helpers() -> None:
    """The forkserver and the resource tracker (started by spawn) would live until we exit."""
    from multiprocessing import forkserver, resource_tracker

    for helper in (forkserver._forkserver, resource_tracker._resource_tracker):
        stop = getattr(helper, "_stop", None)
        if stop is not None:
            with contextlib.suppress(Exception):
                stop()


def final_leak_check() -> dict[str, Any]:
    _stop_mp_helpers()
    me = psutil.Process()
    deadline = now() + 3.0
    while me.children(recursive=True) and now() < deadline:
        time.sleep(0.05)
    left = me.children(recursive=True)
    for p in left:
        _reap(p)
    return {"processes": [f"{p.pid}" for p in left], "segments": _sweep_segments(os.getpid())}


# --------------------------------------------------------------------------- report


def _met(ok: bool) -> str:
    return "yes" if ok else "**NO**"


def _pct(x: float) -> str:
    return f"{x:.2f} %"


def _row(label: str, x: Summary, base: Summary | None = None, target: str = "",
         ok: bool | None = None) -> list[str]:
    ratio = "" if base is None else fmt_ratio(x.p50 / base.p50)
    return [label, fmt_time(x.p50), fmt_time(x.p99), ratio, target, "" if ok is None else _met(ok)]


def _variant_rows(prefix: str, s: dict[str, Summary]) -> list[list[str]]:
    return [_row(f"{prefix}: {label}", s[name], s["pipe"]) for name, label in VARIANTS.items()]


def _small_rows(small: dict[str, Summary]) -> list[list[str]]:
    ex, pipe = small["executor"], small["pipe"]
    return [
        _row("small RPC 64 B → 2 workers: executor", ex, pipe, "≤ 1.5× Pipe (aim 1.0×)",
             ex.p50 / pipe.p50 <= 1.5),
        _row("small RPC: Pipe ping-pong ×2 (baseline)", pipe, pipe),
        _row("small RPC: ProcessPoolExecutor(2), 2 tasks", small["pool"], pipe),
        *_variant_rows("small RPC", small),
    ]


def _payload_rows(size: int, kind: str, s: dict[str, Summary]) -> list[list[str]]:
    ex, pipe = s["executor"], s["pipe"]
    target, ok = "", None
    if size == 1:
        target, ok = "≥ 4× faster than Pipe (≤ 0.25×)", ex.p50 / pipe.p50 <= 0.25
    elif kind == "tensor":
        target, ok = "≤ 40 ms p50", ex.p50 <= 0.040
    what = f"{size} MiB " + ("torch int32 tensor" if kind == "tensor" else "bytes")
    base = "send_bytes" if kind == "bytes" else "pickle.dumps + send_bytes"
    return [
        _row(f"{what} → 2 workers: executor", ex, pipe, target, ok),
        _row(f"{what}: Pipe {base} ×2 (baseline)", pipe, pipe),
        *_variant_rows(what, s),
    ]


def _failure_rows(kill: dict[str, Any], driver: dict[str, Any]) -> list[list[str]]:
    fork, spawn = kill["fork"], kill["spawn"]
    rows = [
        _row("worker SIGKILL → ExecutorFailedError in blocked call (fork)", fork["error"],
             target="≤ 10 ms p50", ok=fork["error"].p50 <= 0.010),
        _row("  of which kernel: SIGKILL → pidfd readable (fork)", fork["exit"]),
        _row("worker SIGKILL → ExecutorFailedError (spawn: no torch in worker)", spawn["error"]),
        _row("  of which kernel: SIGKILL → pidfd readable (spawn)", spawn["exit"]),
    ]
    for mode in ("idle", "busy"):
        s = driver[mode]
        rows.append(_row(f"driver SIGKILL → all workers gone ({mode})", s,
                         target="≤ 200 ms (judged on p99)", ok=s.p99 <= 0.200))
    return rows


def _idle_rows(i: dict[str, Any], hot: Summary) -> list[list[str]]:
    worst = max(i["worker_pct"])
    wake = _row("first call after 0.4 s idle (wake-up); ratio vs hot p50", i["wake"],
                target="≈ 1 ms")
    wake[3] = fmt_ratio(i["wake"].p50 / hot.p50)
    return [
        [f"idle worker CPU, worst of 2 over {i['wall']:.1f} s (psutil)", _pct(worst), "", "",
         "< 1 % of a core", _met(worst < 1.0)],
        ["idle worker CPU, worst of 2 (schedstat, ns)", _pct(max(i["worker_sched_pct"])),
         "", "", "", ""],
        ["idle driver process CPU (all threads)", _pct(i["driver_pct"]), "", "", "", ""],
        wake,
    ]


def _startup_rows(startup: dict[str, Any]) -> list[list[str]]:
    rows = []
    for method, s in startup.items():
        rows.append(_row(f"start-up to READY ({method}; first: {fmt_time(s['first'])})",
                         s["start"]))
        rows.append(_row(f"shutdown ({method})", s["stop"]))
    return rows


def build_rows(r: dict[str, Any]) -> list[list[str]]:
    t = r["throughput"]
    rows = _small_rows(t["small"])
    for size in (1, 32):
        for kind in ("bytes", "tensor"):
            rows += _payload_rows(size, kind, t[f"{size}MiB-{kind}"])
    rows += _failure_rows(r["kill"], r["driver"])
    rows += _idle_rows(r["idle"], t["small"]["executor"])
    return rows + _startup_rows(r["startup"])


HEADER = ["measurement", "p50", "p99", "ratio vs Pipe p50", "target (issue 2)", "met"]


def markdown(r: dict[str, Any], rows: list[list[str]], plan: Plan, quick: bool) -> str:
    m = r["machine"]
    notes = [
        f"Measured {m['date']} on {m['nproc']} CPUs, Python {m['python']}, {m['platform']}; "
        f"load average {m.get('loadavg', '?')} at start, {r.get('loadavg_end', '?')} at end"
        + (" — **quick mode** (few reps, sanity only)." if quick else "."),
        "Command: `python bench/bench_executor.py" + (" --quick" if quick else "") + "`. "
        f"Reps: {plan.small_calls} small calls per system (after {plan.small_warmup} warm-up), "
        f"{plan.mib1_reps} × 1 MiB, {plan.mib32_reps} × 32 MiB, {plan.kill_reps} worker kills, "
        f"{plan.driver_reps} driver kills per case, {plan.start_reps} start-ups per method.",
        "Executor: default `ExecutorConfig` (1 MiB chunks × 8), 2 `EchoWorker`s, fork; the driver "
        "has torch imported. Executor and baselines are timed in interleaved blocks in the same "
        "run; ratios are executor p50 / baseline p50 (below 1 means faster).",
        "Baselines: small — `conn.send((cmd, x))` to 2 forked processes over duplex "
        "`multiprocessing.Pipe`, then `recv()` from both; `ProcessPoolExecutor(2)` (fork) — 2 "
        "`submit`s, wait for both. Payloads — `send_bytes(payload)` to both (tensor: "
        "`pickle.dumps(tensor)` once, then `send_bytes` to both; the child unpickles), small ack "
        "back; the executor calls `nbytes`, so replies are small too.",
        "Driver death: a `python -c` driver (fork) is SIGKILLed with its workers idle or inside "
        "`sleep(600)`; 'gone' = exited (zombie or reaped), polled every 0.2 ms with psutil.",
        f"Worker-death error text: `{r['kill']['message']}`",
    ]
    leaks = r["leaks"]
    notes.append("Left behind after the run: " + (
        "nothing (no child process, no `faultlab_*` segment)." if not any(leaks.values())
        else f"processes {leaks['processes']}, segments {leaks['segments']} (cleaned up)."))
    body = ["## Executor", "", markdown_table(HEADER, rows), ""]
    body += [f"- {n}" for n in notes]
    return "\n".join(body) + "\n"


def _jsonable(x: Any) -> Any:
    if isinstance(x, Summary):
        return dataclasses.asdict(x)
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_jsonable(v) for v in x]
    return x


# --------------------------------------------------------------------------- main


def run(plan: Plan) -> dict[str, Any]:
    import torch  # noqa: F401 - imported up front, as a model driver would (fork inherits it)

    r: dict[str, Any] = {"machine": machine()}
    steps: list[tuple[str, Callable[[Plan], Any]]] = [
        ("throughput", bench_throughput), ("kill", bench_kill), ("driver", bench_driver_death),
        ("idle", bench_idle), ("startup", bench_startup),
    ]
    try:
        for name, step in steps:
            t0 = now()
            print(f"[bench_executor] {name} ...", file=sys.stderr, flush=True)
            r[name] = step(plan)
            print(f"[bench_executor] {name} done in {now() - t0:.1f} s", file=sys.stderr, flush=True)
    finally:
        r["leaks"] = final_leak_check()
        r["loadavg_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return r


ROUNDTRIP = "Large round trips (issue 14)"


def roundtrip_main(args: argparse.Namespace) -> int:
    import _roundtrip

    t0 = now()
    pooled = _roundtrip.run_all(args.quick, before_tree=args.before_tree)
    before = json.loads(Path(args.before).read_text()) if args.before else None
    rows = _roundtrip.rows(pooled, before)
    print(text_table(_roundtrip.HEADER, rows))
    print(f"left behind: {final_leak_check()}   ({now() - t0:.0f} s)")
    if args.json:
        Path(args.json).write_text(json.dumps(pooled))
    if args.out:
        m = machine()
        body = [f"## {ROUNDTRIP}", "", markdown_table(_roundtrip.HEADER, rows), "",
                f"- Measured {m['date']} on {m['nproc']} CPUs, load average {m.get('loadavg', '?')}"
                + (" — **quick mode**." if args.quick else ".")
                + " Command: `python bench/bench_executor.py --roundtrip`; see `bench/_roundtrip.py`."]
        write_section(args.out, ROUNDTRIP, "\n".join(body) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="few reps, finishes in about a minute")
    ap.add_argument("--out", help="markdown file whose '## Executor' section is (re)written "
                    "(default: bench/RESULTS.md for a full run, nothing for --quick)")
    ap.add_argument("--json", help="also dump every summary to this JSON file")
    ap.add_argument("--roundtrip", action="store_true", help="only the large round trips "
                    "(payload there and back, back to back and mixed, vs Pipe)")
    ap.add_argument("--before", help="--roundtrip: JSON of an earlier --roundtrip run to compare")
    ap.add_argument("--before-tree", help="--roundtrip: a checkout of an earlier version whose "
                    "executor runs interleaved in the same run, as the 'before' columns")
    args = ap.parse_args(argv)
    if args.roundtrip:
        return roundtrip_main(args)
    plan = QUICK if args.quick else FULL
    out = args.out or (None if args.quick else str(HERE / "RESULTS.md"))
    t0 = now()
    r = run(plan)
    rows = build_rows(r)
    print(text_table(HEADER, rows))
    print(f"\nleft behind: {r['leaks']}   ({now() - t0:.0f} s)")
    if out:
        write_section(out, "Executor", markdown(r, rows, plan, args.quick))
        print(f"wrote the '## Executor' section of {out}")
    if args.json:
        Path(args.json).write_text(json.dumps(_jsonable(r), indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
