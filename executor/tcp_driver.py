"""The driver's end of the TCP transport: one thread owns the socket that remote workers reach.

    collective_rpc ─► BroadcastWriter ─► shm ring (local ranks)
                                     └─► TcpBroadcastWriter ─seal─► inproc ─┐
                                                                            ▼
    remote worker r ◄─────── TCP (ZeroMQ ROUTER, HMAC on every message) ── DriverHub thread
          (the handshake passes tcp_gate's ConnectionGate first, served by the hub thread)
          │                                                                 │  heartbeats out,
          └── reply / READY / heartbeat ──► ROUTER ─unseal─► inproc ─► TcpReplies ─► ReplyCollector
                                                            └─► on_lost(node, ranks, why)

    agent of node k ══ its link "a<k>.<n>" (HMAC under the secret) ══ hub: AGENT beats in,
        HEARTBEAT out; begin(n+1) ─► RESTART(NodeConfig, nonce) ─► the agent forks new workers
    (tcp_channels.py: the executor's per-incarnation writer and reply readers on the inproc pair)

Invariants:
- One hub for the executor's life (executor/remote_site.py); ``begin`` starts incarnation n
  (a fresh session key from the secret and a nonce, worker identities "r<rank>.<n>") and
  ``end(n)`` says BYE to its workers; only ``stop`` (the executor's end) tells the agents.
- Only the hub thread touches the ROUTER socket.  The executor's two inproc ends are used
  under the executor's send lock (requests) and reply lock (replies), one thread at a time.
- No peer sends a message before its connection passed the gate (tcp_gate.py: a token
  derived from the secret or a session key, at most MAX_FRAME_BYTES buffered before that).
- Nothing from the network is unpickled before ``unseal`` accepted its HMAC.  A message that
  fails it is dropped and counted; from the identity of a registered remote worker it also
  fails the executor (the link was tampered with).  An authentic message of an older
  incarnation (or a request written for one) is dropped and counted as stale.
- A remote worker is lost when a send to it finds its connection gone (EHOSTUNREACH, within
  a heartbeat interval of its death) or it has been silent ``node_timeout`` seconds.  The hub
  reports the first loss of an incarnation once.  An agent silent ``node_timeout`` (counted
  from the incarnation's start at the earliest: its time to rejoin by HELLO) fails that
  incarnation's start naming its node.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import pickle
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import zmq

from executor.config import ExecutorConfig
from executor.errors import AuthenticationError, WorkerStartupError
from executor.protocol import RemoteError
from executor.tcp_gate import ConnectionGate, guard_server
from executor.tcp_wire import (
    AGENT,
    AGENT_KINDS,
    BYE,
    CONFIG,
    DATA,
    HEARTBEAT,
    HELLO,
    KIND_NAMES,
    READY,
    RESTART,
    START_ERROR,
    Envelope,
    agent_identity,
    head_incarnation,
    node_identity,
    peek_head,
    poll_ms,
    rank_identity,
    seal,
    session_key,
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
    incarnation: int = 0  # set by DriverHub.begin, with the nonce of its session key
    nonce: bytes = b""


def poller_for(sock: zmq.Socket[Any], interrupt_fds: Sequence[int]) -> zmq.Poller:
    """A poller on ``sock`` and on every interrupt fd (cancel or death pipe)."""
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    for fd in interrupt_fds:
        poller.register(fd, zmq.POLLIN)
    return poller


def relayed_payload(frames: Sequence[zmq.Frame]) -> bytes:
    """The payload of a relayed message (its head, then its frames), copied once.

    Relays forward the received ``zmq.Frame`` objects themselves: a zero-copy send of a
    Python buffer would start pyzmq's garbage-collector thread (a process-wide thread and
    context that outlive the executor)."""
    return frames[1].bytes if len(frames) == 2 else b"".join(f.buffer for f in frames[1:])


def new_socket(ctx: zmq.Context[Any], kind: int) -> zmq.Socket[Any]:
    """A socket that never drops (no high-water mark) and does not linger at close."""
    sock: zmq.Socket[Any] = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 0)  # never drop; the collector's deadlines bound every wait
    sock.setsockopt(zmq.RCVHWM, 0)
    return sock


class DriverHub(threading.Thread):
    """Owns the ROUTER socket for the executor's life: requests out, replies in, heartbeats,
    and the agents' links, over which each new incarnation is started (``begin``)."""

    def __init__(self, cfg: ExecutorConfig, secret: bytes) -> None:
        super().__init__(name="faultlab-tcp-hub", daemon=True)
        self.cfg, self.secret = cfg, secret
        self.ctx = zmq.Context()
        self.gate = ConnectionGate(self.ctx, [secret])  # session keys are admitted by begin()
        self.router = new_socket(self.ctx, zmq.ROUTER)
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a send to a gone peer raises
        guard_server(self.router)
        try:
            self.router.bind(f"tcp://{cfg.driver_host}:{cfg.driver_port}")
        except zmq.ZMQError as exc:
            self.router.close(linger=0)
            self.gate.close()
            self.ctx.term()
            raise OSError(f"cannot listen on {cfg.driver_host}:{cfg.driver_port} for remote "
                          f"workers: {exc}") from exc
        self.port = int(self.router.getsockopt_string(zmq.LAST_ENDPOINT).rsplit(":", 1)[1])
        self._open_inproc()
        self._wake = WakeupPipe()  # begin/end/stop: read by the hub thread
        os.set_blocking(self._wake.r, False)
        self._commands: collections.deque[tuple[str, int]] = collections.deque()
        self._cond = threading.Condition()
        # The incarnation being started or served, and its state; replaced by begin(),
        # guarded by _cond (the hub thread reads the plain references it holds).
        self.incarnation = -1
        self._keys: dict[int, bytes] = {}  # every incarnation's session key: old ones name stale messages
        self._config_blob = b""
        self._ranks: dict[bytes, int] = {}  # this incarnation's worker identities
        self._ended = True  # no incarnation is being started or served
        self.begun_at = 0.0
        self.pids: dict[int, int] = {}  # rank -> pid, from READY
        self._start_errors: dict[int, RemoteError] = {}
        self.lost: str | None = None  # this incarnation's first loss
        self.serving = False  # start-up is over: losses are reported to on_lost
        self.on_lost: LostCallback | None = None
        self.agent_seen: dict[int, float] = {}  # node -> its agent's last sign of life
        # Only the hub thread touches these.
        self._last_seen: dict[bytes, float] = {}  # this incarnation's workers
        self._agents: dict[int, bytes] = {}  # node -> its agent's link
        self._restart_sent: dict[int, int] = {}  # node -> the incarnation it was sent
        self._hellos: set[bytes] = set()  # agents that said HELLO between incarnations
        self._term_on_exit = False  # close() ran on this thread: end the context on the way out
        self.rejected = 0  # messages that failed authentication
        self.stale = 0  # authentic messages of an older incarnation, dropped
        self.last_rejection = ""

    def _open_inproc(self) -> None:
        base = f"inproc://faultlab-hub-{os.getpid()}-{id(self)}"
        self._requests_in = new_socket(self.ctx, zmq.PULL)
        self._requests_in.bind(base + "-requests")
        self._replies_out = new_socket(self.ctx, zmq.PUSH)
        self._replies_out.bind(base + "-replies")
        self.requests_out = new_socket(self.ctx, zmq.PUSH)  # executor side, under the send lock
        self.requests_out.connect(base + "-requests")
        self.replies_in = new_socket(self.ctx, zmq.PULL)  # executor side, under the reply lock
        self.replies_in.connect(base + "-replies")

    @property
    def address(self) -> str:
        return f"{self.cfg.driver_host}:{self.port}"

    def session_key(self, incarnation: int) -> bytes:
        return self._keys[incarnation]

    @property
    def refused(self) -> int:
        """Connections refused at the gate for a wrong token."""
        return self.gate.refused

    # ------------------------------------------------------------------ the loop

    def run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        poller.register(self._requests_in, zmq.POLLIN)
        poller.register(self._wake.r, zmq.POLLIN)
        poller.register(self.gate.sock, zmq.POLLIN)
        next_beat = 0.0
        try:
            while True:
                events = dict(poller.poll(poll_ms(self.cfg.heartbeat_interval)))
                if self._wake.r in events and not self._run_commands():
                    break
                if self.gate.sock in events:
                    self.gate.answer_all()
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
            for sock in (self.router, self._requests_in, self._replies_out, self.gate.sock):
                sock.close(linger=0)
            if self._term_on_exit:
                self.ctx.term()

    def _run_commands(self) -> bool:
        """What begin/end/stop asked for; False on stop."""
        try:
            os.read(self._wake.r, 4096)
        except BlockingIOError:
            pass
        while self._commands:
            what, incarnation = self._commands.popleft()
            if what == "stop":
                return False
            if what == "begin":
                self._last_seen.clear()  # the old workers were told BYE by end()
                for node in list(self._agents):
                    self._send_restart(node)
                for identity in self._hellos:
                    self._send(identity, seal(self.secret, CONFIG, -1, 0, [self._config_blob],
                                              incarnation))
                self._hellos.clear()
            elif what == "end":
                bye = seal(self._keys[incarnation], BYE, -1, 0, (), incarnation)
                for identity in list(self._last_seen):
                    self._send(identity, bye)
                self._last_seen.clear()
        return True

    @staticmethod
    def _drain(sock: zmq.Socket[Any], handle: Callable[[list[zmq.Frame]], None]) -> None:
        while True:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            handle(frames)

    def _on_network(self, frames: list[zmq.Frame]) -> None:
        identity, raw = frames[0].bytes, [f.buffer for f in frames[1:]]  # views: no copy yet
        try:
            env = unseal(self._key_for(raw), raw)
        except AuthenticationError as exc:
            self._reject(identity, str(exc))
            return
        if env.kind in (HELLO, AGENT):
            self._on_agent(identity, env)
        elif env.incarnation != self.incarnation or self._ended:
            self._drop_stale(identity, env)
        elif self._ranks.get(identity) != env.rank:
            self._reject(identity, f"an authenticated {env.kind} claims rank {env.rank}")
        else:
            self._last_seen[identity] = time.monotonic()
            if env.kind == DATA:
                self._replies_out.send_multipart(frames[2:], copy=False)  # head + frames
            elif env.kind in (READY, START_ERROR):
                self._on_started(env)

    def _key_for(self, raw: list[memoryview]) -> bytes:
        """The secret for agents' messages, else the session key the head names (unknown: none)."""
        head = peek_head(raw)
        if head is None or head[0] in AGENT_KINDS:
            return self.secret
        return self._keys.get(head[1], b"")

    def _drop_stale(self, identity: bytes, env: Envelope) -> None:
        self.stale += 1
        log.info("tcp: dropped a %s of incarnation %d from %r (now %d)",
                 KIND_NAMES[env.kind], env.incarnation, identity, self.incarnation)

    def _on_agent(self, identity: bytes, env: Envelope) -> None:
        node = env.rank
        expected = node_identity(node) if env.kind == HELLO else agent_identity(node, env.incarnation)
        if identity != expected or not 1 <= node < self.cfg.nnodes:
            self._reject(identity, f"an authenticated agent message claims node {node}")
            return
        with self._cond:
            self.agent_seen[node] = time.monotonic()
            self._cond.notify_all()
        if env.kind == HELLO:
            if self._ended:
                self._hellos.add(identity)  # answered when the next incarnation begins
            else:
                self._send(identity, seal(self.secret, CONFIG, -1, 0, [self._config_blob],
                                          self.incarnation))
            return
        self._agents[node] = identity
        if env.incarnation < self.incarnation and not self._ended:
            self._send_restart(node)

    def _send_restart(self, node: int) -> None:
        """Tell ``node``'s agent to start the current incarnation (once per incarnation)."""
        if self._restart_sent.get(node) == self.incarnation or self._ended:
            return
        self._restart_sent[node] = self.incarnation
        self._send(self._agents[node], seal(self.secret, RESTART, -1, 0, [self._config_blob],
                                            self.incarnation))

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
        if head_incarnation(frames[1].bytes) != self.incarnation or self._ended:
            self.stale += 1  # a request written for an incarnation that has ended
            return
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
            for node, link in list(self._agents.items()):
                if link == identity:  # gone, or reconnecting as its next incarnation
                    del self._agents[node]

    def _beat(self) -> None:
        now = time.monotonic()
        if not self._ended:
            beat = seal(self._keys[self.incarnation], HEARTBEAT, -1, 0, (), self.incarnation)
            for identity, seen in list(self._last_seen.items()):
                self._send(identity, beat)
                if now - seen > self.cfg.node_timeout:
                    self._lose([self._ranks[identity]], f"sent nothing for {now - seen:.1f} s")
        agent_beat = seal(self.secret, HEARTBEAT, -1, 0)
        for identity in list(self._agents.values()):
            self._send(identity, agent_beat)

    def _lose(self, ranks: list[int], why: str) -> None:
        with self._cond:
            if self.lost is not None or self._ended:
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
        byes = [(identity, seal(self.secret, BYE, -1, 0)) for identity in self._agents.values()]
        if not self._ended:
            bye = seal(self._keys[self.incarnation], BYE, -1, 0, (), self.incarnation)
            byes += [(identity, bye) for identity in self._last_seen]
        for identity, frames in byes:
            try:
                self.router.send_multipart([identity, *frames], zmq.NOBLOCK)
            except zmq.ZMQError:
                pass  # gone already

    # ------------------------------------------------------------------ executor side

    def begin(self, node_config: NodeConfig) -> int:
        """Start a new incarnation: a session key, fresh state, RESTART to every agent."""
        with self._cond:
            incarnation = self.incarnation + 1
            nonce = secrets.token_bytes(16)
            self._keys[incarnation] = session_key(self.secret, incarnation, nonce)
            self.gate.admit(self._keys[incarnation])  # before any of its workers can connect
            self._config_blob = pickle.dumps(
                dataclasses.replace(node_config, incarnation=incarnation, nonce=nonce))
            self._ranks = {rank_identity(r, incarnation): r for r in self.cfg.remote_ranks}
            self.pids, self._start_errors, self.lost = {}, {}, None
            self.serving, self.on_lost, self._ended = False, None, False
            self.begun_at = time.monotonic()
            self.incarnation = incarnation
        self._command("begin", incarnation)
        return incarnation

    def end(self, incarnation: int) -> None:
        """``incarnation`` is over: BYE to its workers, no more losses; any thread, any time."""
        with self._cond:
            if incarnation != self.incarnation or self._ended:
                return
            self._ended, self.serving = True, False
        self._command("end", incarnation)

    def _command(self, what: str, incarnation: int) -> None:
        self._commands.append((what, incarnation))
        self._wake.wake()

    def wait_ready(self, deadline: float, timeout: float) -> None:
        """Block until every remote worker said READY; raise WorkerStartupError otherwise."""
        with self._cond:
            while True:
                self._raise_start_error()
                missing = [r for r in self.cfg.remote_ranks if r not in self.pids]
                if not missing:
                    return
                self._raise_agent_gone(missing)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise WorkerStartupError(
                        f"remote worker(s) {missing} did not report READY within {timeout:g} s: "
                        f"start them with `faultlab worker --driver {self.address} --node-rank K` "
                        "(and the secret) or raise ExecutorConfig.startup_timeout"
                    )
                self._cond.wait(min(remaining, self.cfg.heartbeat_interval))

    def _raise_agent_gone(self, missing: list[int]) -> None:
        """A node whose agent was known but has been silent ``node_timeout`` (counted from no
        earlier than this incarnation's start: that long to rejoin) is reported by name."""
        now = time.monotonic()
        for node in sorted({self.cfg.node_of(r) for r in missing}):
            seen = self.agent_seen.get(node)
            if seen is not None and now - max(seen, self.begun_at) > self.cfg.node_timeout:
                raise WorkerStartupError(
                    f"node {node} (ranks {self.cfg.node_ranks(node)}) is gone: its `faultlab "
                    f"worker` agent has sent nothing for {now - seen:.1f} s and did not rejoin "
                    f"within node_timeout ({self.cfg.node_timeout:g} s); start it again with "
                    f"`faultlab worker --driver {self.address} --node-rank {node}`")

    def _raise_start_error(self) -> None:
        for rank, error in sorted(self._start_errors.items()):
            raise WorkerStartupError(
                f"remote worker rank {rank} (node {self.cfg.node_of(rank)}) failed to start: "
                f"{error.type_name}: {error.message}\n\nWorker traceback:\n{error.traceback}"
            )
        if self.lost is not None:
            raise WorkerStartupError(f"before READY: {self.lost}")

    def serve(self, incarnation: int, on_lost: LostCallback) -> str | None:
        """Start-up is over: report a loss to ``on_lost`` from now on; return one seen before."""
        with self._cond:
            if incarnation != self.incarnation or self._ended:
                return f"incarnation {incarnation} ended before it served"
            self.on_lost = on_lost
            self.serving = True
            return self.lost

    def stop(self) -> None:
        """Make the thread say BYE to everyone and close its sockets; any thread, any time."""
        self._command("stop", -1)

    def close(self) -> None:
        """After the thread ended and no executor thread uses its ends: release everything."""
        for sock in (self.requests_out, self.replies_in):
            sock.close(linger=0)
        if threading.current_thread() is self:
            self._term_on_exit = True
        elif not self.is_alive():
            self.ctx.term()
        self._wake.close()
