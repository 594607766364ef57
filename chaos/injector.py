"""External faults: signals and helper processes, sent from the chaos side on a schedule.

    Injector.start() ── timer thread ── at t0 + at_s ──► external fault: signal / helper now
                                                     └─► internal fault: arm-<i>-any (a worker fires it)
                    (an outside_reaper due at 0 starts in start() itself, before any call)
    CallCounter (driver failpoint) ── k-th call enqueued ──► Injector.fire(r, info)
    KillNode ── node_tree(node) (chaos.nodes) ──► SIGKILL / SIGSTOP every pid of the tree at once

Nothing here runs inside a worker: a worker is hit only by ``os.kill``.  Every fault is
logged (``ControlDir.log_fault``) before it acts.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from chaos import surroundings
from chaos.control import ControlDir
from chaos.faults import (
    ForkInDriver,
    InterruptDriver,
    KillDriver,
    KillNode,
    OutsideReaper,
    PlanError,
    StarveCPU,
    StarveMemory,
)
from chaos.plan import ResolvedFault
from executor.surfaces import ExecutorLike

_BUSY = "import time\nend = time.monotonic() + {d}\nwhile time.monotonic() < end: pass\n"
_HOG = ("import time\nb = bytearray({n})\nfor i in range(0, len(b), 4096): b[i] = 1\n"
        "print('held', flush=True)\ntime.sleep({d})\n")


class Injector:
    def __init__(self, ctl: ControlDir, resolved: list[ResolvedFault],
                 kill_driver: Callable[[], None] | None = None,
                 node_tree: Callable[[int], list[int]] = lambda node: []) -> None:
        self.ctl = ctl
        self.node_tree = node_tree  # node -> its agent's pid, then every pid below it
        self.resolved = resolved
        self.pids: list[int] = []
        self.kill_driver = kill_driver
        self.t0 = 0.0  # monotonic time the workload started
        self.helpers: list[subprocess.Popen[bytes]] = []
        self.stopped: set[int] = set()  # pids we SIGSTOPped and did not resume
        self.executor: ExecutorLike | None = None  # what a fork_in_driver child calls (mode "call")
        self.forked: list[tuple[int, int, float]] = []  # driver children: (index, pid, may live s)
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-injector", daemon=True)

    # ------------------------------------------------------------ schedule

    def start(self, pids: list[int]) -> None:
        self.pids = list(pids)
        self.t0 = time.monotonic()
        for r in self.resolved:
            if r.at_s == 0.0 and isinstance(r.fault, OutsideReaper):
                self._due(r)  # here and now: a call as short as a shrunk workload's runs under it
            elif r.at_s is not None:
                self._schedule(r.at_s, functools.partial(self._due, r))
        self._thread.start()

    def _schedule(self, after_s: float, action: Callable[[], None]) -> None:
        with self._lock:
            heapq.heappush(self._heap, (time.monotonic() + after_s, next(self._seq), action))
        self._wake.set()

    def _run(self) -> None:
        while not self._done.is_set():
            with self._lock:
                due = self._heap[0][0] if self._heap else None
                if due is not None and due <= time.monotonic():
                    _, _, action = heapq.heappop(self._heap)
                else:
                    action = None
            if action is not None:
                action()
                continue
            self._wake.wait(None if due is None else max(0.0, due - time.monotonic()))
            self._wake.clear()

    def _due(self, r: ResolvedFault) -> None:
        info = {"at_s": r.at_s, "elapsed_s": round(time.monotonic() - self.t0, 4)}
        if r.fault.external:
            self.fire(r, info)
        else:
            self.ctl.arm(r.index, None, info)

    # ------------------------------------------------------------ actions

    def fire(self, r: ResolvedFault, info: dict[str, Any]) -> None:
        """Run external fault ``r`` now."""
        f = r.fault
        if isinstance(f, KillNode):
            self._hit_node(r, f, info)
            return
        pid = self._target(r)
        self.ctl.log_fault({"index": r.index, "kind": f.kind, "rank": f.rank, "pid": pid,
                            "phase": f.phase, "call": info.get("call"),
                            "method": info.get("method"), "msg_id": info.get("msg_id"),
                            "by": "chaos"})
        try:
            self._act(r, pid)
        except ProcessLookupError:
            pass  # the target is already gone: the fault lands on nothing

    def _hit_node(self, r: ResolvedFault, f: KillNode, info: dict[str, Any]) -> None:
        """The whole tree at once: collected first, then signalled without waiting."""
        pids = self.node_tree(f.node)
        self.ctl.log_fault({"index": r.index, "kind": f.kind, "rank": -1, "node": f.node,
                            "mode": f.mode, "pid": pids[0] if pids else None, "pids": pids,
                            "phase": f.phase, "call": info.get("call"),
                            "method": info.get("method"), "msg_id": info.get("msg_id"),
                            "by": "chaos"})
        sig = signal.SIGKILL if f.mode == "kill" else signal.SIGSTOP
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                continue
            if sig == signal.SIGSTOP:
                self.stopped.add(pid)  # stop() resumes it: the scenario's cleanup ends it

    def _target(self, r: ResolvedFault) -> int | None:
        f = r.fault
        if f.target == "worker" and f.signal is not None:
            return self.pids[f.rank] if f.rank < len(self.pids) else None
        return os.getpid() if f.target == "driver" else None

    def _act(self, r: ResolvedFault, pid: int | None) -> None:
        """Deliver an external fault; a kind with no way to be delivered raises."""
        f = r.fault
        if f.target == "worker" and f.signal is not None:
            if pid is not None:
                self._signal(pid, f.signal, getattr(f, "duration", None))
        elif isinstance(f, KillDriver):
            if self.kill_driver is not None:
                self.kill_driver()
        elif isinstance(f, InterruptDriver):
            os.kill(os.getpid(), signal.SIGINT)  # the main thread raises KeyboardInterrupt
        elif isinstance(f, ForkInDriver):
            pid = surroundings.fork_child(f, r.index, self.ctl.path, self.executor)
            self.forked.append((r.index, pid, f.duration + surroundings.CHILD_WATCHDOG_S + 2.0))
        elif isinstance(f, OutsideReaper):  # stays until the scenario has shut the executor down
            surroundings.start_outside_reaper(f.mode)
        elif isinstance(f, StarveCPU):
            self._helpers([_BUSY.format(d=f.duration)] * f.processes, f.duration)
        elif isinstance(f, StarveMemory):
            self._helpers([_HOG.format(n=f.megabytes << 20, d=f.duration)], f.duration)
        else:
            raise PlanError(f"{f.kind}: the chaos side has no way to deliver it at phase "
                            f"{f.phase!r}")

    def _signal(self, pid: int, sig: int, duration: float | None) -> None:
        os.kill(pid, sig)
        if sig == signal.SIGSTOP:
            self.stopped.add(pid)
            if duration is not None:
                self._schedule(duration, lambda: self._resume(pid))
        elif sig == signal.SIGCONT:
            self.stopped.discard(pid)

    def _resume(self, pid: int) -> None:
        self.stopped.discard(pid)
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass

    def _helpers(self, scripts: list[str], duration: float) -> None:
        procs = [subprocess.Popen([sys.executable, "-c", s], stdout=subprocess.DEVNULL)
                 for s in scripts]
        self.helpers += procs
        self._schedule(duration + 0.5, lambda: _end(procs))

    # ------------------------------------------------------------ end

    def stop(self) -> None:
        """Cancel what is still scheduled, resume stopped workers, end every helper."""
        self._done.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(5.0)
        for pid in list(self.stopped):
            self._resume(pid)
        _end(self.helpers)
        for index, pid, within_s in self.forked:
            (self.ctl.path / f"fork-{index}.exit").write_text(surroundings.reap(pid, within_s))


def _end(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()
