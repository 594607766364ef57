"""The node agent's link to the driver between and during incarnations (``faultlab worker``).

    run_node: HELLO ─► CONFIG(n=0) ─► fork the group ─► NodeAgent.serve(config, group)
    serve:  DEALER "a<node>.<n>" ══ TCP ══► the driver's hub (HMAC under the secret; the
            connection shows the secret's token at the driver's gate, tcp_gate.py)
        every heartbeat_interval: AGENT(node, n) ─►        ◄─ HEARTBEAT (a sign of life)
        ◄─ RESTART(n' > n, NodeConfig): the group leaves (death pipe closed); once it is
           gone (or shutdown_grace passed) return the new config ─► run_node stops and reaps
           what is left, forks the group of n' and serves again
        ◄─ BYE, SIGTERM/SIGINT, or the driver silent node_timeout: return None: leave

Invariants:
- The link's ZeroMQ context exists only inside ``serve``: it is ended before the agent forks
  the next group, so no worker inherits the agent's sockets (or its TCP connection, which
  would hide the agent's death from the driver).
- A worker of this node that dies does not end the agent: it waits for RESTART or BYE.
- Nothing from the network is unpickled before ``unseal`` accepted its HMAC; a RESTART of
  an incarnation not newer than the running one is ignored.
"""

from __future__ import annotations

import logging
import pickle
import signal
import time
from typing import TYPE_CHECKING, Any

import zmq

from executor.errors import AuthenticationError
from executor.tcp_driver import NodeConfig, new_socket
from executor.tcp_gate import present
from executor.tcp_wire import AGENT, BYE, RESTART, agent_identity, poll_ms, seal, unseal

if TYPE_CHECKING:
    from executor.tcp_worker import NodeGroup

log = logging.getLogger("executor.tcp")


class NodeAgent:
    """Holds one node's link to the driver while a group of its workers runs."""

    def __init__(self, driver: str, node: int, secret: bytes) -> None:
        self.driver, self.node, self.secret = driver, node, secret
        self.stopping = False  # SIGTERM/SIGINT: leave

    def install_signals(self) -> None:
        def stop(_signum: int, _frame: Any) -> None:
            self.stopping = True  # serve returns within a heartbeat; then the group is stopped

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)

    def serve(self, config: NodeConfig, group: NodeGroup) -> NodeConfig | None:
        """Until the driver says what comes next: the next incarnation's config, or None."""
        ctx = zmq.Context()
        sock = new_socket(ctx, zmq.DEALER)
        try:
            sock.setsockopt(zmq.ROUTING_ID, agent_identity(self.node, config.incarnation))
            present(sock, self.secret)
            sock.connect(f"tcp://{self.driver}")
            return self._loop(sock, config, group)
        finally:
            sock.close(linger=0)
            ctx.term()  # before the next fork

    def _loop(self, sock: zmq.Socket[Any], config: NodeConfig, group: NodeGroup) -> NodeConfig | None:
        cfg, incarnation = config.cfg, config.incarnation
        last_seen, next_beat = time.monotonic(), 0.0
        following: NodeConfig | None = None
        leave_by = float("inf")
        while not self.stopping:
            now = time.monotonic()
            if following is not None and (not group.sentinels or now >= leave_by):
                return following
            if now - last_seen > cfg.node_timeout:
                log.warning("node %d: no message from the driver for %.1f s; leaving",
                            self.node, now - last_seen)
                return None
            if now >= next_beat:
                sock.send_multipart(seal(self.secret, AGENT, self.node, 0, (), incarnation))
                next_beat = now + cfg.heartbeat_interval
            poller = zmq.Poller()
            poller.register(sock, zmq.POLLIN)
            for fd in group.sentinels:
                poller.register(fd, zmq.POLLIN)
            events = dict(poller.poll(poll_ms(max(0.0, next_beat - time.monotonic()))))
            if sock not in events:
                continue
            for kind, payload in self._take(sock):
                last_seen = time.monotonic()
                if kind == BYE:
                    log.info("node %d: the driver shut down", self.node)
                    return None
                if kind == RESTART and following is None:
                    following = self._restart(payload, incarnation, group)
                    leave_by = time.monotonic() + cfg.shutdown_grace
        return None

    def _restart(self, payload: bytes, incarnation: int, group: NodeGroup) -> NodeConfig | None:
        config: NodeConfig = pickle.loads(payload)  # authenticated: from the driver
        if config.incarnation <= incarnation:
            return None  # stale: never acted on
        log.info("node %d: restart: incarnation %d -> %d", self.node, incarnation,
                 config.incarnation)
        group.leave()
        return config

    def _take(self, sock: zmq.Socket[Any]) -> list[tuple[int, bytes]]:
        """The authentic messages waiting on the link, as (kind, payload)."""
        got: list[tuple[int, bytes]] = []
        while True:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return got
            try:
                env = unseal(self.secret, frames)
            except AuthenticationError as exc:
                log.error("node %d: rejected a message on the driver's link: %s", self.node, exc)
                continue
            got.append((env.kind, bytes(env.payload())))
