"""Ending worker processes with escalation: ask, then SIGTERM, then SIGKILL.

    close death pipe (done by the caller) ─► SIGCONT all (a stopped worker cannot see EOF)
      ─► wait shutdown_grace ─► SIGTERM the rest ─► wait sigterm_grace ─► SIGKILL the rest ─► reap

Every step is reported through ``on_step(name, ranks)`` (the executor records it as a
span event).  After ``stop_processes`` returns, every process has been reaped.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess

_REAP_TIMEOUT = 5.0


def _signal(process: BaseProcess, sig: int) -> None:
    if process.pid is None:
        return
    try:
        os.kill(process.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _wait_exit(
    processes: Sequence[BaseProcess], timeout: float, exit_fds: dict[int, int]
) -> list[BaseProcess]:
    """Wait until all have exited or ``timeout`` passed; return those still alive."""
    deadline = time.monotonic() + timeout
    alive = [p for p in processes if p.exitcode is None]
    while alive:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        wait([exit_fds.get(id(p), p.sentinel) for p in alive], remaining)
        alive = [p for p in alive if p.exitcode is None]
    return alive


def stop_processes(
    processes: Sequence[tuple[int, BaseProcess, int]],
    grace: float,
    sigterm_grace: float,
    on_step: Callable[[str, list[int]], None] = lambda step, ranks: None,
) -> None:
    """Stop ``(rank, process, exit fd)`` whose death pipe is already closed; reap them all.

    The exit fd (a pidfd, or -1 for the sentinel) sees the process itself exit, even while a
    child it forked still holds the sentinel pipe."""
    rank_of = {id(p): rank for rank, p, _ in processes}
    exit_fds = {id(p): fd for _, p, fd in processes if fd >= 0}
    procs = [p for _, p, _ in processes if p.pid is not None]
    for p in procs:
        _signal(p, signal.SIGCONT)
    alive = _wait_exit(procs, grace, exit_fds)
    for step, sig, timeout in (("sigterm", signal.SIGTERM, sigterm_grace),
                               ("sigkill", signal.SIGKILL, _REAP_TIMEOUT)):
        if not alive:
            break
        on_step(step, sorted(rank_of[id(p)] for p in alive))
        for p in alive:
            _signal(p, sig)
            _signal(p, signal.SIGCONT)
        alive = _wait_exit(alive, timeout, exit_fds)
    for p in procs:
        p.join(0 if p.exitcode is not None else _REAP_TIMEOUT)
