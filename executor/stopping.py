"""Ending worker processes with escalation: ask, then SIGTERM, then SIGKILL.

    close death pipe (done by the caller) ─► SIGCONT all (a stopped worker cannot see EOF)
      ─► wait shutdown_grace ─► SIGTERM the rest ─► wait sigterm_grace ─► SIGKILL the rest ─► reap

Every step is reported through ``on_step(name, ranks)`` (the executor records it as a
span event).  After ``stop_processes`` returns, every process has been reaped (by us, or by
whoever else reaps the caller's children: SIGCHLD set to SIG_IGN, a SIGCHLD handler).

Liveness is the pidfd's (executor/exits.py), never multiprocessing's ``exitcode``, which
says "running" forever once another handler reaped the process (a busy wait until every
deadline, then signals to a pid that is free or reused); signals go through the pidfd.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Sequence
from multiprocessing.process import BaseProcess

from executor import exits

_REAP_TIMEOUT = 5.0
Child = tuple[BaseProcess, int]  # a process and its pidfd (-1: none, use the sentinel)


def _signal(child: Child, sig: int) -> None:
    """Through the pidfd (the one seam for every signal shutdown sends)."""
    exits.send_signal(*child, sig)


def _wait_exit(children: Sequence[Child], timeout: float) -> list[Child]:
    """Wait until all have exited or ``timeout`` passed; return those still alive."""
    deadline = time.monotonic() + timeout
    alive = [c for c in children if not exits.has_ended(*c)]
    while alive:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        exits.wait_ended(alive, remaining)
        alive = [c for c in alive if not exits.has_ended(*c)]  # ended ones are never waited on again
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
    children = [(p, fd) for _, p, fd in processes if p.pid is not None]
    for child in children:
        _signal(child, signal.SIGCONT)
    alive = _wait_exit(children, grace)
    for step, sig, timeout in (("sigterm", signal.SIGTERM, sigterm_grace),
                               ("sigkill", signal.SIGKILL, _REAP_TIMEOUT)):
        if not alive:
            break
        on_step(step, sorted(rank_of[id(p)] for p, _ in alive))
        for child in alive:
            _signal(child, sig)
            _signal(child, signal.SIGCONT)
        alive = _wait_exit(alive, timeout)
    for child in children:
        exits.ended(*child)  # reap what has ended (nothing blocks: a stuck one stays)
