"""How a queue end waits for the other side without burning a core or sleeping through work.

    waiter                                             notifier
    ──────                                             ────────
    spin: check ready() in a loop  (off by default: on 2 cores it starves the other side)
    yield: sched_yield + check      (~200 µs)
    block: sleeping[i] = 1                             publish (chunk written / chunk freed)
           fence()                                     fence()
           ready()? ─ yes → sleeping[i] = 0            if sleeping[i]: ring doorbell i
           poll([doorbell i, *interrupt fds])    ◄──── (one byte on a non-blocking pipe)
           drain, sleeping[i] = 0, loop

The store-then-load on each side (flag then check; publish then flag read) is Dekker's
pattern: both ``fence()`` calls are needed or a wake-up can be lost on x86 (stores may pass
later loads).  A lost wake-up is also bounded: the block step never sleeps longer than
``block_slice_s`` before it checks again, so the worst case is latency, never a hang.

Interrupt fds (the driver's cancel pipe, a worker's death pipe) wake the waiter at once;
the caller's ``on_interrupt`` decides what that means by raising.

A wait for peers that were asleep skips spin and yield.  The driver's request writer notes
in a ``Warmth`` whether it had to ring a worker's doorbell (the worker was in its block
step); its reply readers share that ``Warmth``.  A woken worker needs a wake-up and its
whole call before it can reply, which outlasts the yield phase (a 1 MiB echo takes
~0.5 ms), and yielding meanwhile takes a core from the workers being woken (two cores, a
driver and two workers: measured in bench/bench_vs_reference.py's mixed workload).  Hot
workers (answering while the driver yields) keep the yield phase.

The block step uses ``poll``, never ``select``: a process that already holds 1,024 fds (a
server with many connections, or a worker forked from one) gets fd numbers ``select``
cannot take.
"""

from __future__ import annotations

import dataclasses
import math
import os
import select
import time
from _thread import allocate_lock as _new_lock
from collections.abc import Callable, Sequence


def fence() -> None:
    """A full memory barrier: acquiring a lock is a locked instruction on every platform.

    A new lock each time (about 50 ns more than a shared one): a KeyboardInterrupt that lands
    between a shared lock's acquire and release would leave it held for every thread of the
    process, and a worker forked while another thread held it would inherit it held."""
    _new_lock().acquire()


@dataclasses.dataclass(frozen=True)
class WaitPolicy:
    """How long each phase lasts.  Measured on 2 cores with a driver and 2 workers
    (bench/bench_executor.py): spinning takes the core a worker needs and doubles small-RPC
    latency; yielding for ~200 µs, then sleeping on the doorbell, is as fast as a Pipe."""

    spin_s: float = 0.0
    yield_s: float = 200e-6
    block_slice_s: float = 0.25


DEFAULT_POLICY = WaitPolicy()


class Doorbell:
    """The waiter's end of a wake-up pipe: a readable fd and a drain."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def drain(self) -> None:
        try:
            os.read(self.fd, 4096)  # one read takes every byte rung so far
        except BlockingIOError:
            pass


def ring(fd: int) -> None:
    """Wake the waiter behind ``fd``; a full pipe already means 'wake up'."""
    try:
        os.write(fd, b"\1")
    except (BlockingIOError, BrokenPipeError, OSError):
        pass


class Warmth:
    """Whether the last message a writer published had to wake a sleeping reader."""

    __slots__ = ("asleep",)

    def __init__(self) -> None:
        self.asleep = False  # one store by the writer, read by the waits that share it


@dataclasses.dataclass
class Sleeper:
    """What one waiter needs: its sleeping flag in shared memory and its doorbell."""

    flags: memoryview
    index: int
    doorbell: Doorbell | None
    interrupt_fds: Sequence[int] = ()
    on_interrupt: Callable[[], None] = lambda: None
    policy: WaitPolicy = DEFAULT_POLICY
    peers: Warmth | None = None  # when they were asleep, skip spin and yield (see above)

    def wait(self, ready: Callable[[], bool], deadline: float | None) -> bool:
        """Return True once ``ready()``; False when ``deadline`` (monotonic) passed first."""
        if ready():
            return True
        if self.peers is not None and self.peers.asleep:
            return self._block(ready, deadline)
        start = time.monotonic()
        if self._spin(ready, start + self.policy.spin_s, deadline):
            return True
        if self._yield(ready, start + self.policy.yield_s, deadline):
            return True
        return self._block(ready, deadline)

    @staticmethod
    def _spin(ready: Callable[[], bool], until: float, deadline: float | None) -> bool:
        end = until if deadline is None else min(until, deadline)
        while time.monotonic() < end:
            if ready():
                return True
        return ready()

    def _yield(self, ready: Callable[[], bool], until: float, deadline: float | None) -> bool:
        # Interrupts are not polled here (a select per turn costs more than the turn): the
        # phase is short, and the block phase that follows watches them.
        end = until if deadline is None else min(until, deadline)
        while time.monotonic() < end:
            os.sched_yield()
            if ready():
                return True
        return ready()

    def _block(self, ready: Callable[[], bool], deadline: float | None) -> bool:
        poller = select.poll()
        for fd in self.interrupt_fds:
            poller.register(fd, select.POLLIN)
        bell = self.doorbell.fd if self.doorbell is not None else -1
        if bell >= 0:
            poller.register(bell, select.POLLIN)
        while True:
            self.flags[self.index] = 1
            fence()
            if ready():
                self.flags[self.index] = 0
                return True
            timeout = self.policy.block_slice_s
            if deadline is not None:
                timeout = min(timeout, deadline - time.monotonic())
                if timeout <= 0:
                    self.flags[self.index] = 0
                    return ready()
            events = poller.poll(math.ceil(timeout * 1000))
            self.flags[self.index] = 0
            if not events:
                continue
            fired = {fd for fd, _ in events}
            if bell in fired:
                self.doorbell.drain()  # type: ignore[union-attr]
            if any(fd in fired for fd in self.interrupt_fds):
                self.on_interrupt()
