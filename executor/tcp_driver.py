"""The driver's end of the TCP transport: one thread owns the socket that remote workers reach.

    collective_rpc ─► BroadcastWriter ─► shm ring (local ranks)
                                     └─► TcpBroadcastWriter ─seal─► inproc ─┐
                                                                            ▼
    remote worker r ◄─────── TCP (ZeroMQ ROUTER, HMAC on every message) ── DriverHub thread
          │                                                                 │  heartbeats out,
          └── reply / READY / heartbeat ──► ROUTER ─unseal─► inproc ─► TcpReplies ─► ReplyCollector
                                                            └─► on_lost(node, ranks, why)

Invariants:
- Only the hub thread touches the ROUTER socket.  The executor's two inproc ends are used
  under the executor's send lock (requests) and reply lock (replies), one thread at a time.
- Nothing from the network is unpickled before ``unseal`` accepted its HMAC.  A message that
  fails it is dropped and counted; from the identity of a registered remote worker it also
  fails the executor (the link was tampered with).
- A remote worker is lost when a send to it finds its connection gone (EHOSTUNREACH, within
  a heartbeat interval of its death) or it has been silent ``node_timeout`` seconds.  The hub
  reports the first loss once and stops serving.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import pickle
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import zmq

from executor.config import ExecutorConfig
from executor.errors import AuthenticationError, WorkerStartupError
from executor.protocol import RemoteError
from executor.tcp_wire import (
    BYE,
    CONFIG,
    DATA,
    HEARTBEAT,
    HELLO,
    READY,
    START_ERROR,
    Envelope,
    node_identity,
    parse_head,
    poll_ms,
    rank_identity,
    seal,
    unseal,
)
from executor.waiting import WaitPolicy
from executor.wakeup import WakeupPipe

log = logging.getLogger("executor.tcp")
LostCallback = Callable[[int, list[int], str], None]


@dataclasses.dataclass(frozen=True)
class NodeConfig:
    """What the driver tells a remote node's agent (sent authenticated, in CONFIG)."""

    cfg: ExecutorConfig
    init_method: str
    wait_policy: WaitPolicy
    trace: tuple[int, int, int] | None = None


def new_socket(ctx: zmq.Context, kind: int) -> zmq.Socket:
    """A socket that never drops (no high-water mark) and does not linger at close."""
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 0)  # never drop; the collector's deadlines bound every wait
    sock.setsockopt(zmq.RCVHWM, 0)
    return sock


class DriverHub(threading.Thread):
    """Owns the ROUTER socket: forwards requests out, replies in, heartbeats both ways."""

    def __init__(self, cfg: ExecutorConfig, secret: bytes, node_config: NodeConfig) -> None:
        super().__init__(name="faultlab-tcp-hub", daemon=True)
        self.cfg, self.secret = cfg, secret
        self._config_blob = pickle.dumps(node_config)
        self.ctx = zmq.Context()
        self.router = new_socket(self.ctx, zmq.ROUTER)
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a send to a gone peer raises
        try:
            self.router.bind(f"tcp://{cfg.driver_host}:{cfg.driver_port}")
        except zmq.ZMQError as exc:
            self.router.close(linger=0)
            self.ctx.term()
            raise OSError(f"cannot listen on {cfg.driver_host}:{cfg.driver_port} for remote "
                          f"workers: {exc}") from exc
        self.port = int(self.router.getsockopt_string(zmq.LAST_ENDPOINT).rsplit(":", 1)[1])
        base = f"inproc://faultlab-hub-{os.getpid()}-{id(self)}"
        self._requests_in = new_socket(self.ctx, zmq.PULL)
        self._requests_in.bind(base + "-requests")
        self._replies_out = new_socket(self.ctx, zmq.PUSH)
        self._replies_out.bind(base + "-replies")
        self.requests_out = new_socket(self.ctx, zmq.PUSH)  # executor side, under the send lock
        self.requests_out.connect(base + "-requests")
        self.replies_in = new_socket(self.ctx, zmq.PULL)  # executor side, under the reply lock
        self.replies_in.connect(base + "-replies")
        self._stop_pipe = WakeupPipe()
        self._ranks = {rank_identity(r): r for r in cfg.remote_ranks}
        self._cond = threading.Condition()
        self.pids: dict[int, int] = {}  # rank -> pid, from READY; guarded by _cond
        self._start_errors: dict[int, RemoteError] = {}
        self._last_seen: dict[bytes, float] = {}  # only the hub thread touches it
        self.lost: str | None = None  # set once, under _cond
        self.serving = False  # set by the executor once start-up is over: losses are reported
        self.on_lost: LostCallback | None = None
        self._term_on_exit = False  # close() ran on this thread: end the context on the way out
        self.rejected = 0  # messages that failed authentication
        self.last_rejection = ""

    @property
    def address(self) -> str:
        return f"{self.cfg.driver_host}:{self.port}"

    # ------------------------------------------------------------------ the loop

    def run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        poller.register(self._requests_in, zmq.POLLIN)
        poller.register(self._stop_pipe.r, zmq.POLLIN)
        next_beat = 0.0
        try:
            while self.lost is None:
                events = dict(poller.poll(poll_ms(self.cfg.heartbeat_interval)))
                if self._stop_pipe.r in events:
                    break
                if self.router in events:
                    self._drain(self.router, self._on_network)
                if self._requests_in in events:
                    self._drain(self._requests_in, self._broadcast)
                if time.monotonic() >= next_beat:
                    self._beat()
                    next_beat = time.monotonic() + self.cfg.heartbeat_interval
        except Exception as exc:  # a dead hub must still fail the executor
            log.exception("tcp hub failed")
            self._lose(self.cfg.remote_ranks, f"the driver's TCP hub failed: {exc!r}")
        finally:
            self._say_bye()
            for sock in (self.router, self._requests_in, self._replies_out):
                sock.close(linger=0)
            if self._term_on_exit:
                self.ctx.term()

    @staticmethod
    def _drain(sock: zmq.Socket, handle: Callable[[list[zmq.Frame]], None]) -> None:
        while True:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            handle(frames)

    def _on_network(self, frames: list[zmq.Frame]) -> None:
        identity, raw = frames[0].bytes, [f.bytes for f in frames[1:]]
        try:
            env = unseal(self.secret, raw)
        except AuthenticationError as exc:
            self._reject(identity, str(exc))
            return
        if self._expected_identity(env) != identity:
            self._reject(identity, f"an authenticated {env.kind} claims rank {env.rank}")
            return
        self._last_seen[identity] = time.monotonic()
        if env.kind == DATA:
            self._replies_out.send_multipart([raw[1], *env.parts], copy=False)
        elif env.kind == HELLO:
            self._send(identity, seal(self.secret, CONFIG, -1, 0, [self._config_blob]))
        elif env.kind in (READY, START_ERROR):
            self._on_started(env)

    def _expected_identity(self, env: Envelope) -> bytes:
        if env.kind == HELLO:
            return node_identity(env.rank)
        return rank_identity(env.rank) if rank_identity(env.rank) in self._ranks else b""

    def _on_started(self, env: Envelope) -> None:
        with self._cond:
            if env.kind == READY:
                self.pids[env.rank] = env.msg_id
            else:
                self._start_errors[env.rank] = pickle.loads(env.payload())  # authenticated
            self._cond.notify_all()

    def _reject(self, identity: bytes, why: str) -> None:
        self.rejected += 1
        self.last_rejection = f"from peer {identity!r}: {why}"
        log.error("tcp: rejected a message %s", self.last_rejection)
        rank = self._ranks.get(identity)
        if rank is not None and identity in self._last_seen:
            self._lose([rank], f"a message on its link failed authentication ({why})")

    def _broadcast(self, frames: list[zmq.Frame]) -> None:
        for identity in self._ranks:
            self._send(identity, frames)

    def _send(self, identity: bytes, frames: Sequence[Any]) -> None:
        try:
            self.router.send_multipart([identity, *frames], copy=False)
        except zmq.ZMQError as exc:
            if exc.errno != zmq.EHOSTUNREACH:
                raise
            if identity in self._ranks:
                self._lose([self._ranks[identity]], "its TCP connection closed")

    def _beat(self) -> None:
        beat = seal(self.secret, HEARTBEAT, -1, 0)
        now = time.monotonic()
        for identity, seen in list(self._last_seen.items()):
            if identity not in self._ranks:
                continue  # an agent: it leaves once its workers started
            self._send(identity, beat)
            if now - seen > self.cfg.node_timeout:
                self._lose([self._ranks[identity]], f"sent nothing for {now - seen:.1f} s")

    def _lose(self, ranks: list[int], why: str) -> None:
        with self._cond:
            if self.lost is not None:
                return
            node = self.cfg.node_of(ranks[0])
            node_ranks = self.cfg.node_ranks(node)
            self.lost = (f"node {node} (ranks {node_ranks}) is lost: rank(s) {ranks} "
                         f"(pid {[self.pids.get(r, 0) for r in ranks]}) {why}")
            self._cond.notify_all()
            callback = self.on_lost if self.serving else None
        log.error("tcp: %s", self.lost)
        if callback is not None:
            callback(node, node_ranks, self.lost)

    def _say_bye(self) -> None:
        bye = seal(self.secret, BYE, -1, 0)
        for identity in self._last_seen:
            try:
                self.router.send_multipart([identity, *bye], zmq.NOBLOCK)
            except zmq.ZMQError:
                pass  # gone already

    # ------------------------------------------------------------------ executor side

    def wait_ready(self, deadline: float, timeout: float) -> None:
        """Block until every remote worker said READY; raise WorkerStartupError otherwise."""
        with self._cond:
            while True:
                self._raise_start_error()
                missing = [r for r in self.cfg.remote_ranks if r not in self.pids]
                if not missing:
                    return
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise WorkerStartupError(
                        f"remote worker(s) {missing} did not report READY within {timeout:g} s: "
                        f"start them with `faultlab worker --driver {self.address} --node-rank K` "
                        "(and the secret) or raise ExecutorConfig.startup_timeout"
                    )
                self._cond.wait(remaining)

    def _raise_start_error(self) -> None:
        for rank, error in sorted(self._start_errors.items()):
            raise WorkerStartupError(
                f"remote worker rank {rank} (node {self.cfg.node_of(rank)}) failed to start: "
                f"{error.type_name}: {error.message}\n\nWorker traceback:\n{error.traceback}"
            )
        if self.lost is not None:
            raise WorkerStartupError(f"before READY: {self.lost}")

    def serve(self, on_lost: LostCallback) -> str | None:
        """Start-up is over: report a loss to ``on_lost`` from now on; return one seen before."""
        with self._cond:
            self.on_lost = on_lost
            self.serving = True
            return self.lost

    def stop(self) -> None:
        """Make the thread say BYE and close its sockets; safe to call any time, any thread."""
        self._stop_pipe.wake()

    def close(self) -> None:
        """After the thread ended and no executor thread uses its ends: release everything."""
        for sock in (self.requests_out, self.replies_in):
            sock.close(linger=0)
        if threading.current_thread() is self:
            self._term_on_exit = True
        elif not self.is_alive():
            self.ctx.term()
        self._stop_pipe.close()


class TcpBroadcastWriter:
    """Seals each request once and hands it to the hub, which sends it to every remote rank."""

    def __init__(self, hub: DriverHub) -> None:
        self._out = hub.requests_out
        self._secret = hub.secret

    def write(self, msg_id: int, parts: Sequence[memoryview | bytes], deadline: float | None) -> None:
        # copy=True: the caller may reuse its buffers once the call returns, as with shm.
        self._out.send_multipart(seal(self._secret, DATA, -1, msg_id, parts), copy=True)


class TcpReplies:
    """Replies from every remote rank on one inproc socket, sorted into one deque per rank."""

    def __init__(
        self, hub: DriverHub, interrupt_fds: Sequence[int], on_interrupt: Callable[[], None]
    ) -> None:
        self._sock = hub.replies_in
        self._queues: dict[int, collections.deque[tuple[int, bytes]]] = {
            r: collections.deque() for r in hub.cfg.remote_ranks
        }
        self._fds = list(interrupt_fds)
        self._on_interrupt = on_interrupt
        self._poller = zmq.Poller()
        self._poller.register(self._sock, zmq.POLLIN)
        for fd in self._fds:
            self._poller.register(fd, zmq.POLLIN)

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
                frames = self._sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            _kind, rank, msg_id = parse_head(frames[0])
            payload = frames[1] if len(frames) == 2 else b"".join(frames[1:])
            self._queues[rank].append((msg_id, payload))


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
