"""Workloads at the edges of the executor's use: bursts, callbacks, hostile values, Ctrl-C
mid-stream, and exhausted resources.  Each declares what its calls must end in
(``expect_errors`` / ``check`` on the recording proxy); ``chaos.edge_oracles`` judges.

    burst / burst_10k   N outstanding non_block calls, payloads small, 64 KiB and 1 MiB:
                        every one completes in order with its own result, no QueueFullError
    callback_chaos      a raising aggregator (that call fails, later ones do not), done-
                        callbacks that call collective_rpc, a raising failure callback
    hostile_values      results and exceptions whose __str__/__repr__/__reduce__ raise:
                        WorkerError (or Reply/RequestPicklingError), the worker keeps serving
    interrupt_stream    multi-chunk requests and replies for interrupt_driver faults, and a
                        reply whose unpickling is interrupted
    interrupt_sweep     KeyboardInterrupt at every point of three calls where CPython can
                        raise it (chaos.interrupt_sweep): no lock held, the queue in step
    interrupt_publish   KeyboardInterrupt at every point of a request's publish, a worker
                        taking the chunk, calls that lap the ring (chaos.publish_interrupts)
    fd_limit            a low RLIMIT_NOFILE in the driver: starting an executor fails clearly
                        (or works), the running one keeps working, nothing leaks
    fd_pressure         1,100 fds held: a second executor's fds (and its forked workers')
                        are all past 1,024, and its calls wait, time out and stream
    memory_cap          RLIMIT_AS in the workers: an allocation fails as a WorkerError
"""

from __future__ import annotations

import dataclasses
import os
import resource
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from chaos import surroundings
from chaos.publish_interrupts import interrupt_publish
from chaos.recording import RecordingExecutor
from chaos.workloads import Workload
from executor import ExecutorError

OK = frozenset({"ok"})
ANY_ERROR = frozenset({"*"})
KIB, MIB = 1 << 10, 1 << 20


def _quiet(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Make a call whose outcome the proxy records; any Exception it raises is judged there."""
    try:
        return fn(*args, **kwargs)
    except Exception:  # noqa: BLE001 - recorded by the proxy, judged by the oracles
        return None


# ---------------------------------------------------------------- bursts

def _burst_call(ex: RecordingExecutor, i: int, big: bytes) -> Any:
    """Call ``i`` of a burst: mostly small echoes, some 64 KiB echoes, a few 1 MiB requests."""
    if i % 50 == 7:
        return ex.collective_rpc("nbytes", args=(big[: MIB - i],), non_block=True, check="burst")
    if i % 10 == 3:
        payload = i.to_bytes(4, "little") * (16 * KIB)  # 64 KiB, unique to the call
        return ex.collective_rpc("echo", args=(payload,), non_block=True, check="burst")
    return ex.collective_rpc("echo", args=(f"burst-{i}",), non_block=True, check="burst")


def burst_of(n: int) -> Workload:
    def burst(ex: RecordingExecutor) -> None:
        """``n`` outstanding non_block calls, then their results in submission order."""
        big = bytes(MIB)
        futures: list[Future[Any]] = []
        for i in range(n):
            try:
                futures.append(_burst_call(ex, i, big))
            except (ExecutorError, TimeoutError):
                break  # recorded; every later submit would fail the same way
        for f in futures:
            _quiet(f.result)

    burst.__name__ = f"burst_{n}"
    return burst


# ---------------------------------------------------------------- callbacks

class ChaosAggregatorError(RuntimeError):
    pass


def _raising_aggregator(values: list[Any]) -> Any:
    raise ChaosAggregatorError(f"chaos: the aggregator raises on {len(values)} values")


def callback_chaos(ex: RecordingExecutor) -> None:
    """A raising aggregator; done-callbacks that call the executor; a raising failure
    callback, then a call that ends every worker: the callbacks after it still run."""
    _quiet(ex.collective_rpc, "echo", args=("aggregated",), timeout=5.0,
           aggregator=_raising_aggregator, expect_errors=ANY_ERROR,
           check="callbacks")
    for i in range(3):
        _quiet(ex.collective_rpc, "echo", args=(f"after-aggregator-{i}",), timeout=5.0,
               expect_errors=OK, check="callbacks")
    _done_callbacks_call(ex)
    _raising_failure_callback(ex)


def _done_callbacks_call(ex: RecordingExecutor) -> None:
    def nested(i: int, future: Future[Any]) -> None:
        _quiet(ex.collective_rpc, "echo", args=(f"from-callback-{i}",), timeout=3.0,
               expect_errors=OK, check="callbacks")

    futures = [ex.collective_rpc("echo", args=(f"outer-{i}",), non_block=True, timeout=5.0)
               for i in range(3)]
    for i, f in enumerate(futures):
        f.add_done_callback(lambda f, i=i: nested(i, f))
    for f in futures:
        _quiet(f.result)


def _raising_failure_callback(ex: RecordingExecutor) -> None:
    ran: list[float] = []

    def raising() -> None:
        raise RuntimeError("chaos: a failure callback raises")

    ex.register_failure_callback(raising)
    ex.register_failure_callback(lambda: ran.append(time.monotonic()))
    _quiet(ex.collective_rpc, "exit", args=(0,), timeout=5.0,  # every worker exits, on purpose
           expect_errors=frozenset({"ExecutorFailedError"}), check="callbacks")

    def wait_for_later_callback() -> bool:
        deadline = time.monotonic() + 10.0
        while not ran and time.monotonic() < deadline:
            time.sleep(0.01)
        if not ran:
            raise AssertionError("a failure callback registered after a raising one never ran")
        return True

    ex.attempt("callback after a raising one", wait_for_later_callback, check="callbacks",
               expect_errors=OK)


# ---------------------------------------------------------------- hostile values

_WORKER_ERROR = frozenset({"WorkerError"})
_HOSTILE: list[tuple[str, Any, tuple[Any, ...], frozenset[str]]] = [
    ("raise: __str__ raises", surroundings.raise_hostile, ("str",), _WORKER_ERROR),
    ("raise: __repr__ raises", surroundings.raise_hostile, ("repr",), _WORKER_ERROR),
    ("raise: __reduce__ exits", surroundings.raise_hostile, ("reduce",), _WORKER_ERROR),
    ("return: cannot pickle", surroundings.return_hostile, ("unpicklable",), _WORKER_ERROR),
    ("return: __reduce__ exits", surroundings.return_hostile, ("reduce_exits",), _WORKER_ERROR),
    ("return: unpickling raises", surroundings.return_hostile, ("explodes_on_unpickle",),
     frozenset({"ReplyUnpicklingError"})),
    ("send: cannot pickle", "echo", (surroundings.Unpicklable(),),
     frozenset({"RequestPicklingError"})),
]


def hostile_values(ex: RecordingExecutor) -> None:
    for i, (_label, method, args, allowed) in enumerate(_HOSTILE):
        _quiet(ex.collective_rpc, method, args=args, timeout=5.0, expect_errors=allowed,
               check="hostile")
        _quiet(ex.collective_rpc, "echo", args=(f"after-hostile-{i}",), timeout=5.0,
               expect_errors=OK, check="hostile")


# ---------------------------------------------------------------- Ctrl-C mid-stream

def interrupt_stream(ex: RecordingExecutor) -> None:
    """Multi-chunk echoes (3 MiB each way) for interrupt_driver faults to land in, then a
    reply whose unpickling sends SIGINT to the driver; every KeyboardInterrupt is caught."""
    end, i = time.monotonic() + STREAM_S, 0
    while i < 4 or time.monotonic() < end:  # long enough for a time-triggered SIGINT
        i += 1
        payload = (i % 256).to_bytes(1, "little") * (3 * MIB - i)
        try:
            ex.collective_rpc("echo", args=(payload,), timeout=10.0)
        except (ExecutorError, TimeoutError, KeyboardInterrupt):
            continue
    try:
        ex.collective_rpc(surroundings.return_interrupter, args=(os.getpid(),), timeout=5.0,
                          unique_reply_rank=0, expect_errors=frozenset({"KeyboardInterrupt"}),
                          check="interrupt")
    except (ExecutorError, TimeoutError, KeyboardInterrupt):
        pass
    for i in range(3):
        _quiet(ex.collective_rpc, "echo", args=(f"after-unpickle-{i}",), timeout=5.0,
               expect_errors=OK, check="interrupt")


interrupt_stream.needs_main_thread = True  # type: ignore[attr-defined]


def interrupt_sweep(ex: RecordingExecutor) -> None:
    """KeyboardInterrupt at every point of a blocking, a non-blocking and a streamed call
    (chaos.interrupt_sweep): no lock left held, the executor in step after each."""
    from chaos.interrupt_sweep import sweep_interrupts

    inner = ex.executor
    calls = [lambda: inner.collective_rpc("echo", args=(b"s",), timeout=10.0),
             lambda: inner.collective_rpc("echo", args=(b"n",), timeout=10.0, non_block=True).result(),
             lambda: inner.collective_rpc("echo", args=(b"m" * (3 * MIB),), timeout=10.0)]

    def sweep() -> str:
        reports = [sweep_interrupts(inner, call, budget_s=SWEEP_BUDGET_S) for call in calls]
        problems = [v for r in reports for v in r.violations]
        if problems:
            raise AssertionError(f"{len(problems)} interrupt point(s) broke the executor: "
                                 + "; ".join(problems[:3]))
        return ", ".join(r.summary() for r in reports)

    ex.attempt("interrupt sweep: every point of three calls", sweep, check="interrupt",
               expect_errors=OK)
    _quiet(ex.collective_rpc, "echo", args=("after-sweep",), timeout=5.0, expect_errors=OK,
           check="interrupt")


interrupt_sweep.needs_main_thread = True  # type: ignore[attr-defined]
SWEEP_BUDGET_S = 30.0


# ---------------------------------------------------------------- resource exhaustion

STREAM_S = 0.8
FD_HEADROOM = 6  # descriptors left free in the driver while the limit is low


def fd_limit(ex: RecordingExecutor) -> None:
    """Few descriptors left (the soft limit: the executor raises it to the hard one when that
    fits, executor/fd_room.py), then a start-up that fails (a worker raising in __init__):
    neither may leak a descriptor, and the running executor keeps working."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    low = len(os.listdir("/proc/self/fd")) + FD_HEADROOM
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(low, soft), hard))
    try:
        ex.attempt("start an executor with few descriptors left",
                   lambda: _start_and_stop(type(ex.executor), ex.config), check="exhaustion",
                   expect_errors=frozenset({"ok", "*"}))
        failing = dataclasses.replace(ex.config, worker="executor.workers:EchoWorker",
                                      worker_kwargs={"fail_on_start": True})
        ex.attempt("a start-up that fails", lambda: _start_and_stop(type(ex.executor), failing),
                   check="exhaustion", expect_errors=frozenset({"WorkerStartupError"}))
        _quiet(ex.collective_rpc, "echo", args=("low-fd-limit",), timeout=5.0,
               expect_errors=OK, check="exhaustion")
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    _quiet(ex.collective_rpc, "echo", args=("fd-limit-restored",), timeout=5.0,
           expect_errors=OK, check="exhaustion")


FD_PRESSURE = 1100  # fds held open while the executor works: every new fd number is past 1,024


def fd_pressure(ex: RecordingExecutor) -> None:
    """Hold 1,100 fds, then start a second executor (its fds, and under fork its workers'
    fds, all past 1,024) and make calls that wait, block, time out and stream in both."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, FD_PRESSURE + 1024)), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(FD_PRESSURE)]
    try:
        ex.attempt("start an executor holding 1,100 fds and wait in it",
                   lambda: _busy_under_fd_pressure(type(ex.executor), ex.config), check="exhaustion",
                   expect_errors=OK)
        _quiet(ex.collective_rpc, "sleep", args=(0.05,), timeout=5.0, expect_errors=OK,
               check="exhaustion")
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _busy_under_fd_pressure(cls: Any, cfg: Any) -> str:
    with cls(cfg) as other:
        other.collective_rpc("sleep", args=(0.05,), timeout=5.0)  # past yielding, into poll
        other.collective_rpc("sleep", args=(0.05,), timeout=5.0, non_block=True).result(5.0)
        try:
            other.collective_rpc("sleep", args=(1.0,), timeout=0.05)
            raise AssertionError("a call past its deadline did not time out")
        except TimeoutError:
            pass
        other.collective_rpc("echo", args=(b"f" * (3 * MIB),), timeout=5.0)
    return "served"


def _start_and_stop(cls: Any, cfg: Any) -> str:
    with cls(cfg) as other:
        other.collective_rpc("echo", args=("nested",), timeout=5.0)
    return "started"


def memory_cap(ex: RecordingExecutor) -> None:
    """Cap every worker at its size plus 256 MiB, allocate 1 GiB there, then uncap."""
    calls: list[tuple[Any, tuple[Any, ...], frozenset[str]]] = [
        (surroundings.cap_memory, (256 * MIB,), OK),
        (surroundings.allocate, (1 << 30,), frozenset({"WorkerError"})),
        ("echo", ("under-the-cap",), OK),
        (surroundings.uncap_memory, (), OK),
        (surroundings.allocate, (64 * MIB,), OK),
    ]
    for method, args, allowed in calls:
        _quiet(ex.collective_rpc, method, args=args, timeout=10.0, expect_errors=allowed,
               check="exhaustion")


EDGE: dict[str, Workload] = {
    "burst": burst_of(200), "burst_10k": burst_of(10_000), "callback_chaos": callback_chaos,
    "done_callbacks": _done_callbacks_call, "failure_callbacks": _raising_failure_callback,
    "hostile_values": hostile_values, "interrupt_stream": interrupt_stream,
    "fd_limit": fd_limit, "memory_cap": memory_cap, "interrupt_sweep": interrupt_sweep,
    "fd_pressure": fd_pressure, "interrupt_publish": interrupt_publish,
}
