"""What a scenario must leave behind: nothing.  Snapshots of processes, shared memory,
file descriptors and threads, taken before the executor starts and after it shut down.

    snapshot() ─► scenario ─► leaks(before, ...) ─► one sentence per thing left behind

Invariant: what multiprocessing keeps for its session-long helpers (the resource tracker,
the forkserver) is not the scenario's leak, even when the scenario's first spawn started
them: their processes (by command line) and their fds (the ones multiprocessing holds
for them at the time of the check) are left out.  So are, in a Jupyter kernel, the fds of
ipykernel's per-thread output sockets (``_kernel_output_fds``): the kernel's, not the scenario's.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
import time
from collections.abc import Iterable

import psutil

from executor.shm import PREFIX, SHM_DIR

# multiprocessing's own session-long helpers: started once per process, not a leak.
SESSION_HELPERS = ("multiprocessing.forkserver", "multiprocessing.resource_tracker")


@dataclasses.dataclass(frozen=True)
class Snapshot:
    shm: frozenset[str]
    fds: dict[int, str]
    threads: frozenset[int]
    children: frozenset[int]


def _fds() -> dict[int, str]:
    out = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            out[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
    return out


def _session_helper_fds() -> set[int]:
    """The fds multiprocessing keeps open, for the whole session, to reach its helpers."""
    from multiprocessing import forkserver, resource_tracker

    held = (getattr(resource_tracker._resource_tracker, "_fd", None),
            getattr(forkserver._forkserver, "_forkserver_alive_fd", None))
    return {fd for fd in held if isinstance(fd, int)}


def _kernel_output_fds() -> set[int]:
    """In a Jupyter kernel: the eventfds of ipykernel's per-thread output sockets.

    ipykernel gives every thread that writes to stdout or stderr its own zmq PUSH socket
    (``IOPubThread._event_pipes``, whose mailbox is an eventfd) and closes it only in a
    sweep every 10 s after the thread ended.  The executor's monitor thread printing
    "executor failed: ..." is enough to make one: the kernel owns it and closes it, so it is
    no leak of the scenario (issue 25: "anon_inode:[eventfd] was left open" in the notebook).
    """
    fds: set[int] = set()
    for stream in (sys.stdout, sys.stderr):
        pipes = getattr(getattr(stream, "pub_thread", None), "_event_pipes", None)
        for socket in list(pipes.values()) if isinstance(pipes, dict) else []:
            try:
                fds.add(int(socket.FD))  # zmq's signalling fd: the eventfd we saw
            except Exception:  # noqa: BLE001 - a closed socket holds no fd
                continue
    return fds


def child_processes(include_zombies: bool = True) -> list[psutil.Process]:
    """This process's descendants, without multiprocessing's session helpers."""
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            if not include_zombies and child.status() == psutil.STATUS_ZOMBIE:
                continue
            if not any(h in " ".join(child.cmdline()) for h in SESSION_HELPERS):
                found.append(child)
        except psutil.Error:
            continue
    return found


def shm_names(owner: int | None = None) -> set[str]:
    """The project's names in /dev/shm: all of them, or those of process ``owner``."""
    prefix = PREFIX if owner is None else f"{PREFIX}{owner}_"
    return {n for n in os.listdir(SHM_DIR) if n.startswith(prefix)}


def snapshot() -> Snapshot:
    return Snapshot(frozenset(shm_names()), _fds(),
                    frozenset(t.ident or 0 for t in threading.enumerate()),
                    frozenset(p.pid for p in child_processes()))


def process_state(pid: int) -> str:
    """'gone', 'zombie' or 'alive'."""
    try:
        status = psutil.Process(pid).status()
    except psutil.NoSuchProcess:
        return "gone"
    return "zombie" if status == psutil.STATUS_ZOMBIE else "alive"


def wait_gone(pids: Iterable[int], within_s: float) -> dict[int, str]:
    """Wait up to ``within_s`` for every pid to be gone; return the ones that are not."""
    deadline = time.monotonic() + within_s
    while True:
        left = {p: s for p in pids if (s := process_state(p)) != "gone"}
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.02)


def leaks(before: Snapshot, worker_pids: Iterable[int], owner_pid: int, ignore_paths: Iterable[str],
          wait_s: float = 3.0) -> list[str]:
    """Everything this scenario left behind, each as a sentence."""
    problems = [f"worker pid {pid} is still {state} after shutdown"
                for pid, state in wait_gone(worker_pids, wait_s).items()]
    deadline = time.monotonic() + wait_s
    while True:
        after = snapshot()
        threads = [t for t in threading.enumerate() if (t.ident or 0) not in before.threads
                   and t.is_alive() and t is not threading.current_thread()]
        if not threads or time.monotonic() >= deadline:
            break
        time.sleep(0.02)
    problems += [f"thread {t.name!r} is still running after shutdown" for t in threads]
    shm = sorted(n for n in after.shm - before.shm if n.startswith(f"faultlab_{owner_pid}_"))
    problems += [f"/dev/shm/{n} was not unlinked" for n in shm]
    ignore, helpers = tuple(ignore_paths), _session_helper_fds() | _kernel_output_fds()
    problems += [f"file descriptor {fd} ({target}) was left open"
                 for fd, target in sorted(after.fds.items())
                 if before.fds.get(fd) != target and not target.startswith(ignore)
                 and fd not in helpers]
    new_children = sorted({p.pid for p in child_processes()} - before.children)
    problems += [f"child process {pid} ({process_state(pid)}) was left behind"
                 for pid in new_children]
    return problems
