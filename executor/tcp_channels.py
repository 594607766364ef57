"""The executor's ends of the TCP transport, one set per incarnation (on the hub's inproc pair).

    collective_rpc ─► TcpBroadcastWriter ─seal(session key n)─► hub.requests_out ─► hub thread
    hub.replies_in ─► TcpReplies (one deque per remote rank) ─► TcpReplyReader ─► ReplyCollector

Invariants:
- The writer is used under the executor's send lock, the readers under its reply lock.
- A reply whose head names another incarnation (left in the inproc pipe by the one before)
  is dropped and counted, never delivered.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Sequence

import zmq

from executor.tcp_driver import DriverHub, poller_for, relayed_payload
from executor.tcp_wire import DATA, head_incarnation, parse_head, poll_ms, seal


class TcpBroadcastWriter:
    """Seals each request once (its incarnation's key) and hands it to the hub, which sends
    it to every remote rank of that incarnation."""

    def __init__(self, hub: DriverHub, incarnation: int) -> None:
        self._out = hub.requests_out
        self._key = hub.session_key(incarnation)
        self._incarnation = incarnation

    def write(self, msg_id: int, parts: Sequence[memoryview | bytes], deadline: float | None) -> None:
        # copy=True: the caller may reuse its buffers once the call returns, as with shm.
        self._out.send_multipart(seal(self._key, DATA, -1, msg_id, parts, self._incarnation),
                                 copy=True)


class TcpReplies:
    """Replies from every remote rank on one inproc socket, sorted into one deque per rank."""

    def __init__(
        self, hub: DriverHub, incarnation: int, interrupt_fds: Sequence[int],
        on_interrupt: Callable[[], None],
    ) -> None:
        self._sock = hub.replies_in
        self._incarnation = incarnation
        self.stale = 0  # replies of an older incarnation still in the inproc pipe, dropped
        self._queues: dict[int, collections.deque[tuple[int, bytes]]] = {
            r: collections.deque() for r in hub.cfg.remote_ranks
        }
        self._fds = list(interrupt_fds)
        self._on_interrupt = on_interrupt
        self._poller = poller_for(self._sock, self._fds)

    def reader(self, rank: int) -> TcpReplyReader:
        return TcpReplyReader(self, rank)

    def read(self, rank: int, deadline: float | None) -> tuple[int, bytes] | None:
        """The oldest reply of ``rank``, left in place until ``ack(rank)``."""
        queue = self._queues[rank]
        while not queue:
            if not self._pump(deadline):
                return None
        return queue[0]

    def ack(self, rank: int) -> None:
        queue = self._queues[rank]
        if queue:
            queue.popleft()

    def _pump(self, deadline: float | None) -> bool:
        """Wait for replies (or an interrupt); False once ``deadline`` has passed."""
        timeout = None
        if deadline is not None:
            timeout = deadline - time.monotonic()
            if timeout <= 0:
                return False
        events = dict(self._poller.poll(poll_ms(timeout)))
        if any(fd in events for fd in self._fds):
            self._on_interrupt()
        if self._sock in events:
            self._take_all()
        return True

    def _take_all(self) -> None:
        while True:
            try:
                frames = self._sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            head = frames[0].buffer
            if head_incarnation(head) != self._incarnation:
                self.stale += 1
                continue
            _kind, rank, msg_id = parse_head(head)
            self._queues[rank].append((msg_id, relayed_payload(frames)))


class TcpReplyReader:
    """``read(deadline)`` for one remote rank, as ``QueueReader`` offers for a local one."""

    def __init__(self, replies: TcpReplies, rank: int) -> None:
        self._replies, self._rank = replies, rank
        self._holding = False  # read returned the head of the rank's deque; ack pops it once

    def read(self, deadline: float | None, hold: bool = False) -> tuple[int, bytes] | None:
        got = self._replies.read(self._rank, deadline)
        if got is not None:
            self._holding = True
            if not hold:
                self.ack()
        return got

    def ack(self) -> None:
        if self._holding:
            self._holding = False
            self._replies.ack(self._rank)
