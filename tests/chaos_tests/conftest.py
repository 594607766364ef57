"""Every chaos test must leave no child process and no new ``/dev/shm`` entry behind.

    snapshot(/dev/shm, children) ─► test ─► wait briefly for children to go ─► compare
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator

import psutil
import pytest

SHM_DIR = "/dev/shm"
# multiprocessing keeps these for the whole session; they are not a test's leak.
_SESSION_HELPERS = ("multiprocessing.forkserver", "multiprocessing.resource_tracker")
_OWNER_RE = re.compile(r"^faultlab_(\d+)_")


def _children() -> list[psutil.Process]:
    alive = []
    for child in psutil.Process().children(recursive=True):
        try:
            cmdline = " ".join(child.cmdline())
            if child.status() != psutil.STATUS_ZOMBIE and not any(
                    helper in cmdline for helper in _SESSION_HELPERS):
                alive.append(child)
        except psutil.NoSuchProcess:
            continue
    return alive


def _new_shm(before: set[str]) -> list[str]:
    def ours(name: str) -> bool:  # another run on this shared machine is not ours to judge
        match = _OWNER_RE.match(name)
        return match is not None and int(match.group(1)) == os.getpid()

    return sorted(n for n in set(os.listdir(SHM_DIR)) - before if ours(n))


@pytest.fixture(autouse=True)
def no_leaks() -> Iterator[None]:
    before = set(os.listdir(SHM_DIR))
    yield
    deadline = time.monotonic() + 5.0
    while (left := _children()) and time.monotonic() < deadline:
        time.sleep(0.05)
    for proc in left:
        proc.kill()
    assert not left, f"child processes left behind: {[(p.pid, p.name()) for p in left]}"
    assert not _new_shm(before), f"/dev/shm entries left behind: {_new_shm(before)}"
