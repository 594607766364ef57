"""Internal faults: failpoint actions that chaos switches on in the driver and the workers.

    driver  driver.before_pickle ─► CallCounter: k-th call of a method? ─► arm file (+ external fault)
            driver.after_enqueue ─► external faults armed for this call (signals, driver kill)
            queue.before_publish ─► damage an rpc chunk (CorruptQueue queue="rpc")
    worker  worker.<phase>       ─► kill / term / exit 0 / hang / slow / raise when armed for this rank
            queue.before_publish ─► damage a reply chunk (CorruptQueue queue="reply")
            queue.mid_chunk_write ─► kill / term at "mid_reply", once a reply chunk is visible

Workers get ``install`` through ``FAULTLAB_FAILPOINTS=chaos.points:install`` (or a
``collective_rpc`` when the start method does not pass the environment on).
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

from chaos import publish_interrupts, surroundings
from chaos.control import ENV_VAR, ControlDir
from chaos.faults import MID_REPLY, CorruptQueue, Fault, HangWorker, RaiseInWorker, SlowWorker
from chaos.plan import ResolvedFault
from executor import failpoints
from executor.shm_queue import ChunkMeta, ShmRingBuffer

INSTALLER = "chaos.points:install"


class PointDispatcher:
    """The action of one failpoint in one process: fires each fault armed for the message."""

    def __init__(self, ctl: ControlDir, faults: list[ResolvedFault], rank: int | None) -> None:
        self.ctl, self.faults, self.rank = ctl, faults, rank
        self.done: set[tuple[int, int | None]] = set()

    def __call__(self, **ctx: Any) -> None:
        msg_id = ctx.get("msg_id")
        for r in self.faults:
            if _half_written_only(r.fault) and not ctx.get("published"):
                continue  # no chunk of this reply is visible yet: not half written
            info = self._armed(r, msg_id)
            if info is not None:
                self.ctl.log_fault(_record(r, self.rank, os.getpid(), msg_id, info))
                act(r, {**ctx, "ctl_path": str(self.ctl.path)})

    def _armed(self, r: ResolvedFault, msg_id: int | None) -> dict[str, Any] | None:
        key = (r.index, None if r.at_s is not None else msg_id)
        if key in self.done or (r.at_s is None and msg_id is None):
            return None
        info = self.ctl.armed(r.index, key[1])
        if info is not None:
            self.done.add(key)
        return info


def _half_written_only(f: Fault) -> bool:
    """A kill or SIGTERM at MID_REPLY waits for a reply with a chunk already visible."""
    return f.phase == MID_REPLY and f.kind != "interrupt_driver"


def _record(r: ResolvedFault, rank: int | None, pid: int, msg_id: Any,
            info: dict[str, Any]) -> dict[str, Any]:
    f = r.fault
    return {"index": r.index, "kind": f.kind, "rank": f.rank if rank is None else rank,
            "pid": pid, "phase": f.phase, "msg_id": msg_id, "call": info.get("call"),
            "method": info.get("method"), "by": "failpoint"}


def act(r: ResolvedFault, ctx: dict[str, Any]) -> None:
    """Do fault ``r`` here, in this process, at this failpoint."""
    if r.fault.kind == "interrupt_driver":
        _INTERRUPTS[r.fault.phase](r.fault, ctx)
        return
    ACTIONS[r.fault.kind](r.fault, ctx)


def _kill_self(fault: Fault, ctx: dict[str, Any]) -> None:
    os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(10)  # SIGKILL is delivered before this returns in practice


def _term_self(fault: Fault, ctx: dict[str, Any]) -> None:
    os.kill(os.getpid(), signal.SIGTERM)  # the worker's handler raises SystemExit here


def _exit_self(fault: Fault, ctx: dict[str, Any]) -> None:
    os._exit(0)  # no cleanup, no reply, no cause: only the exit code says it ended


def _block(fault: HangWorker, ctx: dict[str, Any]) -> None:
    end = time.monotonic() + (fault.duration if fault.duration is not None else 1e9)
    while (left := end - time.monotonic()) > 0:
        time.sleep(min(left, 0.5))  # SIGTERM still raises SystemExit between sleeps


def _slow(fault: SlowWorker, ctx: dict[str, Any]) -> None:
    time.sleep(fault.delay)


def _raise(fault: RaiseInWorker, ctx: dict[str, Any]) -> None:
    raise RuntimeError(f"{fault.message} (rank {ctx.get('rank')}, phase {fault.phase})")


def _corrupt(fault: CorruptQueue, ctx: dict[str, Any]) -> None:
    damage_chunk(ctx["ring"], ctx["index"], fault.mode)


def damage_chunk(ring: ShmRingBuffer, index: int, mode: str) -> None:
    """Damage chunk ``index`` of ``ring`` the way ``mode`` (a key of ``DAMAGE``) says.

    A chunk damaged after it was published (``AFTER_PUBLISH``) may already have been taken
    by every reader, which then never looks at it again; the header also claims the next
    message published, so a reader that took it finds the next one published but not
    written: the same damage, seen whichever side of the race the readers were on.  When
    every reader took the chunk and none looks again before the next message, that publish
    would overwrite the claim unseen: the writer checks the header first and sees it."""
    meta = ChunkMeta(ring.buf, ring.metas[index])
    DAMAGE[mode](meta, ring.buf, ring.datas[index], ring.spec.n_chunks)
    if mode in AFTER_PUBLISH:
        ring.overstate_published()


def _flip_payload(meta: ChunkMeta, buf: memoryview, data: int, n_chunks: int) -> None:
    if meta.read()["length"] > 0:
        buf[data] ^= 0xFF


def _truncate(meta: ChunkMeta, buf: memoryview, data: int, n_chunks: int) -> None:
    length = meta.read()["length"]
    meta.write(length=max(0, length - 1), reseal=True)  # only the payload checksum can tell


def _clobber_seq(meta: ChunkMeta, buf: memoryview, data: int, n_chunks: int) -> None:
    meta.write(seq=0xFFFF_FFFF, reseal=False)


def _clobber_flags(meta: ChunkMeta, buf: memoryview, data: int, n_chunks: int) -> None:
    meta.write(flags=meta.read()["flags"] ^ ChunkMeta.FIRST, reseal=False)


def _overwrite_unread(meta: ChunkMeta, buf: memoryview, data: int, n_chunks: int) -> None:
    meta.write(seq=meta.read()["seq"] + n_chunks, reseal=True)  # as if the writer lapped the reader


def _drop(meta: ChunkMeta, buf: memoryview, data: int, n_chunks: int) -> None:
    flags = meta.read()["flags"] & ~(ChunkMeta.FIRST | ChunkMeta.LAST)
    meta.write(flags=flags | ChunkMeta.ABORT | ChunkMeta.LAST, reseal=True)


def _clear_written(meta: ChunkMeta, buf: memoryview, data: int, n_chunks: int) -> None:
    meta.written = 0  # after publish: a reader waiting for this chunk must not wait forever


def _all_ff(meta: ChunkMeta, buf: memoryview, data: int, n_chunks: int) -> None:
    size = ChunkMeta.SIZE_WITH_FIRST_READ_FLAG
    buf[meta.meta : meta.meta + size] = b"\xff" * size


AFTER_PUBLISH = frozenset({"clear_written", "all_ff"})  # damage a chunk already visible


ACTIONS: dict[str, Callable[[Any, dict[str, Any]], None]] = {
    "kill_worker": _kill_self, "term_worker": _term_self, "exit_worker": _exit_self,
    "hang_worker": _block,
    "slow_worker": _slow, "raise_in_worker": _raise, "corrupt_queue": _corrupt,
    "fork_in_worker": surroundings.fork_grandchild_then_die,
}
# interrupt_driver, by phase: where it fires, and who sends the SIGINT.
_INTERRUPT_POINTS = {"mid_request": ("driver", "queue.mid_chunk_write"),
                     "mid_reply": ("worker", "queue.mid_chunk_write"),
                     "before_unpickle_reply": ("driver", "driver.after_dequeue"),
                     "before_publish": ("driver", "queue.before_publish"),
                     "after_written": ("driver", "queue.before_publish")}
_INTERRUPTS: dict[str, Callable[[Any, dict[str, Any]], None]] = {
    "mid_request": surroundings.interrupt_self, "before_unpickle_reply": surroundings.interrupt_self,
    "mid_reply": surroundings.interrupt_driver_from_worker,
    "before_publish": surroundings.interrupt_self,
    "after_written": publish_interrupts.interrupt_once_visible,
}
DAMAGE: dict[str, Callable[[ChunkMeta, memoryview, int, int], None]] = {
    "flip_payload": _flip_payload, "truncate": _truncate, "clobber_seq": _clobber_seq,
    "clobber_flags": _clobber_flags, "overwrite_unread": _overwrite_unread, "drop": _drop,
    "clear_written": _clear_written, "all_ff": _all_ff,
}


def point_of(r: ResolvedFault) -> str:
    f = r.fault
    if f.kind == "interrupt_driver":
        return _INTERRUPT_POINTS[f.phase][1]
    if f.kind == "corrupt_queue":
        after = getattr(f, "mode", "") in AFTER_PUBLISH
        return "queue.after_publish" if after else "queue.before_publish"
    if f.phase == MID_REPLY:  # the worker's reply writer, between two chunks
        return "queue.mid_chunk_write"
    return f"worker.{f.phase}"


def _role_of(f: Fault) -> str:
    """The process an internal fault runs in: "driver" or "worker" (of ``f.rank``)."""
    if f.kind == "interrupt_driver":
        return _INTERRUPT_POINTS[f.phase][0]
    rpc = f.kind == "corrupt_queue" and getattr(f, "queue", "") == "rpc"
    return "driver" if rpc else "worker"


def faults_for(resolved: list[ResolvedFault], role: str,
               rank: int | None) -> dict[str, list[Any]]:
    """The internal faults this process must run, grouped by failpoint."""
    points: dict[str, list[ResolvedFault]] = defaultdict(list)
    for r in resolved:
        f = r.fault
        if f.external:
            continue
        where = _role_of(f)
        if (role == "driver" == where) or (role == "worker" == where and f.rank == rank):
            points[point_of(r)].append(r)
    return points


def install(role: str = "worker", rank: int | None = None, ctl_path: str | None = None) -> list[str]:
    """Enable this process's internal faults; returns the failpoints switched on."""
    path = ctl_path or os.environ.get(ENV_VAR)
    if not path:
        return []
    ctl = ControlDir(path)
    enabled = []
    for point, faults in faults_for(ctl.read_plan(), role, rank).items():
        failpoints.enable(point, PointDispatcher(ctl, faults, rank))
        enabled.append(point)
    return enabled


def install_in_worker(worker: Any, ctl_path: str) -> list[str]:
    """For ``collective_rpc``: install in a worker whose environment lacks the variable."""
    failpoints.disable()
    return install("worker", worker.rank, ctl_path)


class CallCounter:
    """Driver side: counts calls per method, arms call-triggered faults, runs external ones."""

    def __init__(self, ctl: ControlDir, resolved: list[ResolvedFault],
                 on_external: Callable[[ResolvedFault, dict[str, Any]], None]) -> None:
        self.ctl = ctl
        self.faults = [r for r in resolved if r.at_s is None]
        self.counts: Counter[str] = Counter()
        self.external: dict[int, list[tuple[ResolvedFault, dict[str, Any]]]] = defaultdict(list)
        self.on_external = on_external

    def before_pickle(self, msg_id: int, method: str, **_: Any) -> None:
        self.counts[method] += 1
        self.counts["*"] += 1
        for r in self.faults:
            n = self.counts[r.method]
            if r.method in (method, "*") and n in r.calls:
                info = {"call": n, "method": method, "msg_id": msg_id}
                if r.fault.external:
                    self.external[msg_id].append((r, info))
                else:
                    self.ctl.arm(r.index, msg_id, info)

    def after_enqueue(self, msg_id: int, method: str, **_: Any) -> None:
        for r, info in self.external.pop(msg_id, []):
            self.on_external(r, info)

    def enable(self) -> None:
        failpoints.enable("driver.before_pickle", self.before_pickle)
        failpoints.enable("driver.after_enqueue", self.after_enqueue)
