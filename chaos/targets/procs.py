"""A target's processes and shared memory, seen from outside (psutil and /proc only).

    ProcessTree(driver pid)
      fence_namespace()        the driver's mount namespace, when the run has one of its own
      belongs(pid)             why pid is provably the run's: "descendant" of the driver, in
                               its "session", in its private "namespace"; None: not provable
      name(ready procs)        role and rank as the target reported them, for the pids that
                               belong; returns the others (``disowned``), never tracked
      discover()               psutil descendants of the driver not named: role "helper"
      discover_session()       anything else still in the driver's session or namespace (it
                               escaped the tree)
      poll_exits(now)          the first moment each process was seen gone (or a zombie)
      statuses()               psutil status of each, for a hang's report
      kill_all()               SIGKILL (and SIGCONT) every live one: nothing outlives a run
    Scanner(tree, every_s)     discover() and held_shm() on a thread of its own, every every_s
                               (reading a big tree's /proc/PID/maps took up to 1.7 s on a
                               loaded machine: on the observer's loop it delayed every event)
    held_shm(pids)             /dev/shm names the processes map or hold open
    shared_segments(pids)      shared writable mappings of /dev/shm files and memfds
    damage(segment, data)      overwrite bytes of one through /proc/PID/mem

Invariants: a process is known by pid *and* create time (psutil.Process), so a recycled pid
is never signalled; the driver's session (it starts with ``start_new_session``) and, when the
run has one, its private mount namespace (chaos.targets.private_mounts) are the fence: a
process the driver started stays in them unless it left on purpose, and no process outside
them and the driver's descendants is ever tracked, signalled or reported, whatever a driver's
``ready`` names (a process started no later than the driver cannot be the run's either).  The tree is
shared by the observer's loop and its Scanner without a lock: procs only grows, entries are
added with ``setdefault`` (a named entry is never replaced by a "helper"), and every walk
iterates a snapshot (``list(...)``, taken in one step under the GIL).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time
from typing import Any

import psutil

SHM_DIR = "/dev/shm"


@dataclasses.dataclass
class Proc:
    role: str
    rank: int | None
    pid: int
    handle: psutil.Process | None
    exit_ns: int | None = None

    def state(self) -> str:
        """psutil's status, or "gone"."""
        if self.handle is None:
            return "gone"
        try:
            return str(self.handle.status()) if self.handle.is_running() else "gone"
        except psutil.Error:
            return "gone"

    def alive(self) -> bool:
        return self.state() not in ("gone", psutil.STATUS_ZOMBIE)

    def to_json(self) -> dict[str, Any]:
        return {"role": self.role, "rank": self.rank, "pid": self.pid, "exit_ns": self.exit_ns}


def _handle(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except psutil.Error:
        return None


def _created(handle: psutil.Process | None) -> float:
    try:
        return handle.create_time() if handle is not None else 0.0
    except psutil.Error:
        return 0.0


def _mnt_ns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None


def _why_not(pid: int) -> str:
    """What an unprovable pid is, for the record: its command and session."""
    handle = _handle(pid)
    if handle is None:
        return "no such process"
    try:
        what = " ".join(handle.cmdline())[:120] or handle.name()
        return f"{what!r} (session {os.getsid(pid)}), not the driver's descendant, session " \
               "or namespace"
    except (OSError, psutil.Error):
        return "gone meanwhile"


class ProcessTree:
    """Every process of one target run, by role and rank."""

    def __init__(self, driver_pid: int) -> None:
        self.driver_pid = driver_pid
        driver = _handle(driver_pid)
        self.procs: dict[int, Proc] = {driver_pid: Proc("driver", None, driver_pid, driver)}
        self._driver_born = _created(driver)
        self.namespace: str | None = None  # the run's own mount namespace, once fenced

    def fence_namespace(self) -> str | None:
        """The driver's mount namespace if it is not the observer's (its own: every process
        in it is the run's), else None.  Read once the driver runs (after its launcher)."""
        theirs, ours = _mnt_ns(self.driver_pid), _mnt_ns(os.getpid())
        self.namespace = theirs if theirs is not None and theirs != ours else None
        return self.namespace

    def belongs(self, pid: int) -> str | None:
        """How ``pid`` is proved to be the run's, or None when it cannot be."""
        handle = _handle(pid)
        if handle is None:
            return None
        if pid == self.driver_pid:
            return "driver"
        if _created(handle) < self._driver_born:
            return None  # older than the driver: it cannot have come from the run
        try:
            if any(p.pid == self.driver_pid for p in handle.parents()):
                return "descendant"
        except psutil.Error:
            return None
        return self._fenced(pid)

    def _fenced(self, pid: int) -> str | None:
        """"session" or "namespace" when ``pid`` is inside the run's fence (not its age)."""
        try:
            if os.getsid(pid) == self.driver_pid:
                return "session"
        except OSError:
            return None
        if self.namespace is not None and _mnt_ns(pid) == self.namespace:
            return "namespace"
        return None

    def name(self, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Role and rank of each entry whose pid belongs to the run; the entries that do not
        (an unrelated process a driver named) come back, each with why, and are left alone."""
        disowned = []
        for entry in entries:
            pid = entry.get("pid")
            if not isinstance(pid, int):
                continue
            rank = entry.get("rank")
            known = self.procs.get(pid)
            if known is not None:
                known.role, known.rank = str(entry.get("role", known.role)), rank
            elif _handle(pid) is None or self.belongs(pid) is not None:  # gone: never signalled
                self.procs[pid] = Proc(str(entry.get("role", "helper")), rank, pid, _handle(pid))
            else:
                disowned.append({"role": entry.get("role"), "rank": rank, "pid": pid,
                                 "why": _why_not(pid)})
        return disowned

    def snapshot(self) -> list[Proc]:
        return list(self.procs.values())

    def find(self, role: str, rank: int | None) -> Proc | None:
        return next((p for p in self.snapshot() if p.role == role and
                     (rank is None or p.rank == rank)), None)

    def discover(self) -> None:
        driver = self.procs[self.driver_pid].handle
        try:
            children = driver.children(recursive=True) if driver is not None else []
        except psutil.Error:
            return
        for child in children:
            self.procs.setdefault(child.pid, Proc("helper", None, child.pid, child))

    def discover_session(self) -> None:
        """Processes still in the driver's session (or its namespace) that ``discover``
        never saw."""
        for proc in psutil.process_iter():
            if proc.pid in self.procs or proc.pid == os.getpid():
                continue
            if self._fenced(proc.pid) is not None and _created(proc) >= self._driver_born:
                self.procs.setdefault(proc.pid, Proc("helper", None, proc.pid, proc))

    def poll_exits(self, now_ns: int) -> None:
        for proc in self.snapshot():
            if proc.exit_ns is None and not proc.alive():
                proc.exit_ns = now_ns

    def others(self) -> list[Proc]:
        return [p for p in self.snapshot() if p.pid != self.driver_pid]

    def pids(self) -> list[int]:
        return [p.pid for p in self.snapshot() if p.exit_ns is None]

    def statuses(self) -> list[dict[str, Any]]:
        return [{"role": p.role, "rank": p.rank, "pid": p.pid, "status": p.state()}
                for p in self.snapshot()]

    def kill_all(self) -> list[int]:
        killed = []
        for proc in self.snapshot():
            if proc.handle is not None and proc.alive():
                try:
                    proc.handle.send_signal(signal.SIGKILL)
                    killed.append(proc.pid)
                except psutil.Error:
                    continue
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline and any(self.procs[p].alive() for p in killed):
            time.sleep(0.01)
        return killed


class Scanner:
    """``tree.discover()`` and the /dev/shm names the tree holds, every ``every_s``, on a
    daemon thread: the observer's event loop never waits for /proc."""

    def __init__(self, tree: ProcessTree, every_s: float) -> None:
        self._tree, self._every_s = tree, every_s
        self._stop = threading.Event()
        self.held: frozenset[str] = frozenset()
        self._thread = threading.Thread(target=self._run, name="target-scanner", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self._every_s):
            self._tree.discover()
            self.held = self.held | held_shm(self._tree.pids())


# ---------------------------------------------------------------- shared memory


@dataclasses.dataclass(frozen=True)
class Segment:
    name: str  # "/dev/shm/NAME" or "memfd:NAME", without " (deleted)"
    pid: int  # a process that maps it
    start: int
    end: int
    deleted: bool

    @property
    def size(self) -> int:
        return self.end - self.start

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "pid": self.pid, "size": self.size, "deleted": self.deleted}


def shm_names() -> set[str]:
    try:
        return set(os.listdir(SHM_DIR))
    except OSError:
        return set()


def held_shm(pids: list[int]) -> set[str]:
    """The /dev/shm names these processes map or hold open (what may be charged to them)."""
    names: set[str] = set()
    for pid in pids:
        for segment in _maps(pid):
            if segment.name.startswith(SHM_DIR + "/"):
                names.add(segment.name[len(SHM_DIR) + 1:])
        names |= _fd_shm(pid)
    return names


def _fd_shm(pid: int) -> set[str]:
    names: set[str] = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return names
    for fd in fds:
        try:
            path = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if path.startswith(SHM_DIR + "/") and not path.endswith(" (deleted)"):
            names.add(path[len(SHM_DIR) + 1:])
    return names


def shared_segments(pids: list[int]) -> list[Segment]:
    """Writable shared mappings of /dev/shm files and memfds, one per name, in the order
    the processes map them (names may be random: the order of creation is what repeats)."""
    found: dict[str, Segment] = {}
    for pid in pids:
        for segment in _maps(pid, writable_shared=True):
            found.setdefault(segment.name, segment)
    return list(found.values())


def _maps(pid: int, writable_shared: bool = False) -> list[Segment]:
    try:
        with open(f"/proc/{pid}/maps") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        parts = line.split(maxsplit=5)
        if len(parts) < 6:
            continue
        addresses, perms, path = parts[0], parts[1], parts[5]
        deleted = path.endswith(" (deleted)")
        path = path.removesuffix(" (deleted)")
        if path.startswith("/memfd:"):
            path = path[1:]
        elif not path.startswith(SHM_DIR + "/"):
            continue
        if writable_shared and not (perms[1] == "w" and perms[3] == "s"):
            continue
        start, end = (int(a, 16) for a in addresses.split("-"))
        out.append(Segment(path, pid, start, end, deleted))
    return out


def damage(segment: Segment, data: bytes, offset: int = 0) -> int:
    """Write ``data`` at ``offset`` into the mapping through /proc/PID/mem; bytes written."""
    data = data[:max(0, segment.size - offset)]
    fd = os.open(f"/proc/{segment.pid}/mem", os.O_RDWR)
    try:
        return os.pwrite(fd, data, segment.start + offset)
    finally:
        os.close(fd)
