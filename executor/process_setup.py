"""Setting up a worker process, local (shm queues) or remote (TCP link): one home for both.

    worker_main / remote_worker_main
        └─ prepare_process(boot) ─► fd hygiene (fork: close the driver's death-pipe write
           ends; forkserver: drop the forkserver's alive fd, adopt the driver's environ)
           ─► fork the exit guard (executor/exit_guard.py) ─► PR_SET_PDEATHSIG=SIGCONT
           ─► SIGTERM/SIGINT handlers ─► telemetry + failpoints
           ─► thread cap ─► mallopt ─► receive pool ─► death-pipe watcher thread  ──► ExitState

Invariants:
- Only the driver holds the death pipe's write end (a forked child closes its inherited
  copy first thing), so EOF means "the driver is gone or wants us gone": the watcher sends
  SIGTERM to the process, then ``os._exit(EXIT_PARENT_DIED)`` after ``exit_grace_s`` if the
  main thread is stuck in C code that signals cannot interrupt.  Both need the GIL: when the
  main thread holds it in C code, the exit guard (a forked child with an interpreter of its
  own) SIGKILLs the worker 10 ms later.
- The kernel sends SIGCONT when the parent dies (``PR_SET_PDEATHSIG``), so even a
  SIGSTOPped worker wakes up to see the EOF.
- SIGTERM/SIGINT raise ``SystemExit`` once; further signals are ignored while cleaning up
  (``ExitState.exiting``) or once one has been taken (``ExitState.terminating``).
- This module imports nothing of the transport: both kinds of worker share it.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Protocol

import telemetry
from executor import death_pipes, failpoints, recv_pool
from executor.exit_guard import start_guard
from executor.protocol import EXIT_PARENT_DIED
from executor.worker_base import WorkerContext

log = logging.getLogger("executor.worker")
_PR_SET_PDEATHSIG = 1


class ProcessBoot(Protocol):
    """What process set-up needs from a bootstrap (local ``WorkerBootstrap`` or remote)."""

    ctx: WorkerContext
    worker: str
    death: Connection
    start_method: str
    thread_cap: int
    exit_grace_s: float
    trace: tuple[int, int, int] | None
    environ: dict[str, str]
    keep_buffers: bool
    driver_pid: int  # the process holding our death pipe's write end


@dataclasses.dataclass
class ExitState:
    """How far the process is on its way out; read by the serve loop and the signal handler."""

    terminating: int = 0  # the signal that asked us to exit, once
    exiting: bool = False  # the loop is done; ignore further signals
    # Set while a served RPC's end record is written (its reply is already out): a SIGTERM
    # then waits for ``take_deferred`` (a shutdown right after a reply must not cut the
    # worker's span short: the driver may already have moved on and closed the death pipe).
    deferring: bool = False
    deferred: int = 0

    def take_deferred(self) -> None:
        """Raise the SystemExit a signal asked for while ``deferring``."""
        signum, self.deferred = self.deferred, 0
        if signum and not (self.terminating or self.exiting):
            self.terminating = signum
            raise SystemExit(128 + signum)


def prepare_process(
    boot: ProcessBoot, report_exit: Callable[[int], None] = lambda code: None,
) -> ExitState:
    """Everything a worker process does before it builds its queues and its worker;
    ``report_exit(code)`` tells the driver why before a hard exit (the READY pipe, locally)."""
    if boot.start_method == "fork":
        death_pipes.close_inherited()  # the driver's write ends, ours and other executors'
    elif boot.start_method == "forkserver":
        _drop_forkserver_alive_fd()
        _adopt_environ(boot.environ)
    start_guard(boot.death.fileno(), boot.exit_grace_s, boot.driver_pid)  # one thread still
    _set_parent_death_signal(signal.SIGCONT)
    state = ExitState()
    _install_signal_handlers(state)
    telemetry.configure_process("worker", boot.ctx.rank)
    failpoints.install_from_env("worker", boot.ctx.rank)
    _cap_threads(boot.thread_cap, boot.ctx.rank)
    if boot.keep_buffers:
        _keep_freed_buffers()
    recv_pool.pool.open_user()  # large request arrays reuse its regions for the process's life
    rec = telemetry.get_recorder()
    if rec.enabled:
        rec.event("worker.start", {"faultlab.rank": boot.ctx.rank, "process.pid": os.getpid(),
                                   "faultlab.start_method": boot.start_method},
                  telemetry.SpanContext.from_wire(boot.trace))
    threading.Thread(
        target=_watch_parent, args=(boot, state, report_exit), name="faultlab-death-pipe",
        daemon=True
    ).start()
    return state


def _close_quietly(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


def _adopt_environ(environ: dict[str, str]) -> None:
    for key in set(os.environ) - set(environ):
        del os.environ[key]
    os.environ.update(environ)


def _drop_forkserver_alive_fd() -> None:
    """Forkserver children inherit the driver's end of the forkserver's 'alive' pipe.

    While any child holds it the forkserver never sees the driver die, so it never exits and
    the kernel never sends its children the parent-death signal: a SIGSTOPped worker would
    then outlive the driver.  Workers do not start processes through the forkserver.
    """
    from multiprocessing import forkserver

    server = forkserver._forkserver
    fd = getattr(server, "_forkserver_alive_fd", None)
    if fd is not None:
        _close_quietly(fd)
        server._forkserver_alive_fd = None  # type: ignore[attr-defined]


def _set_parent_death_signal(sig: int) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the death pipe alone must do
        pass


def _install_signal_handlers(state: ExitState) -> None:
    def handler(signum: int, _frame: object) -> None:
        if state.terminating or state.exiting:
            return
        if state.deferring:
            state.deferred = signum
            return
        state.terminating = signum
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def _keep_freed_buffers() -> None:
    """Serve large allocations from the heap and do not trim it, so that the buffer of one
    message is reused by the next instead of being unmapped and page-faulted in again."""
    m_trim_threshold, m_mmap_threshold = -1, -3
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(m_mmap_threshold, 1 << 30)
        libc.mallopt(m_trim_threshold, 1 << 30)
    except (OSError, AttributeError):  # not glibc
        pass


def _cap_threads(cap: int, rank: int) -> None:
    if "OMP_NUM_THREADS" in os.environ:
        log.info("worker %d: OMP_NUM_THREADS=%s set by the user; not capping threads",
                 rank, os.environ["OMP_NUM_THREADS"])
        return
    os.environ["OMP_NUM_THREADS"] = str(cap)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(cap)
    log.info("worker %d: capped intra-op threads to %d (set OMP_NUM_THREADS to override)",
             rank, cap)


def _watch_parent(boot: ProcessBoot, state: ExitState, report_exit: Callable[[int], None]) -> None:
    fd = boot.death.fileno()
    try:
        while os.read(fd, 1):
            pass
    except OSError:
        return
    if failpoints.ACTIVE:
        failpoints.fire("worker.death_pipe", rank=boot.ctx.rank)
    rec = telemetry.get_recorder()
    if rec.enabled:  # when the driver was killed, this is the moment its death was seen
        # Its own trace: parented to start-up, it would stretch that trace over the whole run.
        rec.event("worker.death_pipe_eof", {"faultlab.rank": boot.ctx.rank, "process.pid": os.getpid()})
    if not state.exiting:
        os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(boot.exit_grace_s)
    report_exit(EXIT_PARENT_DIED)  # the cause is named only when we said it
    os._exit(EXIT_PARENT_DIED)  # still here: stuck in C code that signals cannot interrupt
