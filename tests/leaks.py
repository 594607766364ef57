"""What a test may not leave behind: child processes, /dev/shm segments, executor threads.

    snapshot ─► test ─► wait (bounded) for children to go ─► kill and report what is left

Session-long helpers that multiprocessing starts itself (the forkserver, the resource
tracker) are not a test's leak.  Only names the project creates are judged, and only
those of this process (``faultlab_<this pid>_...``, see ``executor/shm.py``): anything
else in ``/dev/shm`` (``psm_*``, another program's, another test run's ``faultlab_<pid>_``)
is not this test's, however it came and went.
"""

from __future__ import annotations

import os
import re
import threading
import time

import psutil

from chaos import resources
from executor.shm import PREFIX, SHM_DIR

_OWNER_RE = re.compile(rf"^{PREFIX}(\d+)_")
_EXEMPT_ROOTS: set[int] = set()  # session-long infrastructure (a Ray cluster's node keepers)


def exempt_tree(pid: int) -> None:
    """Process ``pid`` and its descendants are the session's, not a test's leak."""
    _EXEMPT_ROOTS.add(pid)


def session_pids() -> set[int]:
    """The session's own infrastructure now: every process of an exempt tree."""
    pids = set()
    for root in _EXEMPT_ROOTS:
        try:
            pids |= {root, *(p.pid for p in psutil.Process(root).children(recursive=True))}
        except psutil.NoSuchProcess:
            pass
    return pids


def children() -> list[psutil.Process]:
    found = resources.child_processes(include_zombies=False)
    if not _EXEMPT_ROOTS:
        return found
    exempt = session_pids()
    return [p for p in found if p.pid not in exempt]


def wait_gone(pids: list[int], wait_s: float) -> list[int]:
    """Wait up to ``wait_s`` for ``pids`` to end (zombies count as ended); those left."""
    deadline = time.monotonic() + wait_s
    while True:
        left = [p for p in pids if resources.process_state(p) == "alive"]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def shm_names() -> set[str]:
    """The project's names in /dev/shm now (anyone's pid: the check filters by owner)."""
    return resources.shm_names()


def _ours(name: str) -> bool:
    match = _OWNER_RE.match(name)
    return match is not None and int(match.group(1)) == os.getpid()


def executor_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("faultlab-")]


def check(shm_before: set[str], wait_s: float = 5.0) -> list[str]:
    """Wait up to ``wait_s`` for leftovers to go; clean up and describe what stayed."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and (children() or executor_threads()):
        time.sleep(0.02)
    problems = []
    for proc in children():
        problems.append(f"process {proc.pid} {proc.name()!r} outlived the test")
        proc.kill()
    for name in sorted(shm_names() - shm_before):
        if _ours(name):
            problems.append(f"/dev/shm/{name} outlived the test")
            try:
                os.unlink(os.path.join(SHM_DIR, name))
            except FileNotFoundError:
                pass
    problems += [f"thread {t.name!r} outlived the test" for t in executor_threads()]
    return problems
