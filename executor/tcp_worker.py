"""The remote worker's end of the TCP transport, and the agent that starts a node's workers.

    faultlab worker --driver HOST:PORT --node-rank K            (the node agent)
        HELLO ──► driver ──► CONFIG (ExecutorConfig, init method, incarnation, nonce)
        loop: fork one worker per rank of node K (a NodeGroup; the agent holds their death
              pipe) ─► NodeAgent.serve (tcp_agent.py) until RESTART (reap this group, loop)
              or BYE / driver silence (reap, exit)

    remote worker rank r
        main thread:  LinkReader.read ◄─ inproc ◄─┐         ┌─► inproc ─► LinkWriter (replies)
                                                  WorkerLink thread ── DEALER ◄══ TCP ══► driver
        every connection to the driver shows a connect token at its gate (tcp_gate.py): the
        agent's from the secret, a worker's from its session key (all it holds)
        the link thread checks every message's HMAC, heartbeats every interval, and on BYE or
        ``node_timeout`` of driver silence leaves exactly as on death-pipe EOF: SIGTERM to
        itself, then ``os._exit`` after a short grace.

Invariants:
- Only the link thread touches the TCP socket; the main thread and the async reply thread
  share the inproc sending end under a lock.
- A request that fails authentication is never unpickled: the reader raises
  ``CorruptMessageError`` for it (the serve loop answers with an error), as for a damaged chunk.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import multiprocessing
import os
import pickle
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import Any

import zmq

from executor import death_pipes
from executor.config import ExecutorConfig
from executor.errors import AuthenticationError, CorruptMessageError
from executor.process_setup import ExitState, prepare_process
from executor.protocol import EXIT_PARENT_DIED, EXIT_STARTUP_FAILED, RemoteError
from executor.stopping import stop_processes
from executor.tcp_driver import NodeConfig, new_socket, poller_for, relayed_payload
from executor.tcp_gate import present
from executor.tcp_wire import (
    BYE,
    CONFIG,
    DATA,
    HEAD_BYTES,
    HEARTBEAT,
    HELLO,
    READY,
    START_ERROR,
    node_identity,
    parse_head,
    poll_ms,
    rank_identity,
    seal,
    session_key,
    unseal,
)
from executor.waiting import WaitPolicy
from executor.worker_base import WorkerContext
from executor.worker_proc import WorkerProc, leave_loop

log = logging.getLogger("executor.tcp")
_DAMAGED = b"X"  # link -> main: a request failed authentication; then its (untrusted) msg_id
_REAP_S = 5.0  # an ended (or SIGKILLed) worker of a group is reaped within this


@dataclasses.dataclass(kw_only=True)
class RemoteBootstrap:
    """Everything a remote worker process starts with (see ``ProcessBoot``)."""

    ctx: WorkerContext
    worker: str
    driver: str  # "host:port"
    secret: bytes  # this incarnation's session key (never the executor's secret itself)
    incarnation: int
    heartbeat_interval: float
    node_timeout: float
    death: Connection  # read end of the agent's death pipe
    start_method: str
    thread_cap: int
    wait_policy: WaitPolicy
    exit_grace_s: float = 0.1
    trace: tuple[int, int, int] | None = None
    environ: dict[str, str] = dataclasses.field(default_factory=lambda: dict(os.environ))
    keep_buffers: bool = True
    driver_pid: int = dataclasses.field(default_factory=os.getpid)  # the agent: it holds our death pipe


class WorkerLink(threading.Thread):
    """Owns this worker's TCP socket; relays requests in and replies out; heartbeats."""

    def __init__(self, boot: RemoteBootstrap, state: ExitState) -> None:
        super().__init__(name="faultlab-tcp-link", daemon=True)
        self.boot, self.state, self.rank = boot, state, boot.ctx.rank
        self.ctx = zmq.Context()
        self.dealer = new_socket(self.ctx, zmq.DEALER)
        self.dealer.setsockopt(zmq.ROUTING_ID, rank_identity(self.rank, boot.incarnation))
        self.dealer.setsockopt(zmq.LINGER, 2000)  # let the last reply / start-up error out
        present(self.dealer, boot.secret)  # the session key's token opens the driver's gate
        self.dealer.connect(f"tcp://{boot.driver}")
        base = f"inproc://faultlab-link-{os.getpid()}"
        self._to_main = new_socket(self.ctx, zmq.PUSH)
        self._to_main.bind(base + "-in")
        self._from_main = new_socket(self.ctx, zmq.PULL)
        self._from_main.bind(base + "-out")
        self.inbox = new_socket(self.ctx, zmq.PULL)  # main thread
        self.inbox.connect(base + "-in")
        self.outbox = new_socket(self.ctx, zmq.PUSH)  # main and reply threads, under outbox_lock
        self.outbox.connect(base + "-out")
        self.outbox_lock = threading.Lock()
        self._stop_r, self._stop_w = os.pipe()
        self.gone_r, self.gone_w = os.pipe()  # readable once the driver is gone: an interrupt fd
        self._leaving = False

    def run(self) -> None:
        poller = zmq.Poller()
        for sock in (self.dealer, self._from_main, self._stop_r):
            poller.register(sock, zmq.POLLIN)
        last_seen = next_beat = time.monotonic()
        while not self._leaving:
            events = dict(poller.poll(poll_ms(self.boot.heartbeat_interval)))
            if self._stop_r in events:
                break
            if self.dealer in events and self._take_network():
                last_seen = time.monotonic()
            if self._from_main in events:
                self._forward_replies()
            now = time.monotonic()
            if now - last_seen > self.boot.node_timeout:
                self._leave(f"no message from the driver for {now - last_seen:.1f} s")
            if now >= next_beat:
                self.dealer.send_multipart(seal(self.boot.secret, HEARTBEAT, self.rank, 0, (),
                                                self.boot.incarnation))
                next_beat = now + self.boot.heartbeat_interval
        # Leaving: the driver is gone, so nothing queued can be delivered; else flush.
        self.dealer.close(linger=0 if self._leaving else None)
        for sock in (self._to_main, self._from_main):
            sock.close()

    def _take_network(self) -> bool:
        """Relay what the driver sent; True if any of it was authentic."""
        authentic = False
        while True:
            try:
                received = self.dealer.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return authentic
            frames = [f.buffer for f in received]  # views: checked in place, never copied here
            try:
                env = unseal(self.boot.secret, frames)
            except AuthenticationError as exc:
                log.error("worker %d: rejected a message from the driver's link: %s", self.rank, exc)
                msg_id = parse_head(frames[1])[2] if len(frames) > 1 and len(frames[1]) == HEAD_BYTES else 0
                self._to_main.send_multipart([_DAMAGED, msg_id.to_bytes(8, "little"), str(exc).encode()])
                continue
            if env.incarnation != self.boot.incarnation:
                continue  # cannot happen (another incarnation's key fails the MAC); never delivered
            authentic = True
            if env.kind == DATA:
                self._to_main.send_multipart(received[1:], copy=False)  # head + frames
            elif env.kind == BYE:
                self._leave("the driver shut down", logging.INFO)

    def _forward_replies(self) -> None:
        while True:
            try:
                frames = self._from_main.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self.dealer.send_multipart(frames, copy=False)

    def _leave(self, why: str, level: int = logging.WARNING) -> None:
        """As on death-pipe EOF: SIGTERM to ourselves, then exit hard if still here."""
        if self._leaving:
            return
        self._leaving = True  # the loop ends and closes its sockets, so the context can end
        log.log(level, "worker %d: leaving: %s", self.rank, why)
        os.write(self.gone_w, b"\1")  # an idle main thread leaves its read at once
        if not self.state.exiting:  # a busy one is interrupted (aimed at it: a process-wide
            signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGTERM)  # one could land here)
        hard_exit = threading.Timer(self.boot.exit_grace_s + 1.0, os._exit, args=(EXIT_PARENT_DIED,))
        hard_exit.daemon = True  # only for a main thread stuck in C code
        hard_exit.start()

    def send(self, kind: int, msg_id: int, parts: Sequence[memoryview | bytes] = ()) -> None:
        frames = seal(self.boot.secret, kind, self.rank, msg_id, parts, self.boot.incarnation)
        with self.outbox_lock:
            self.outbox.send_multipart(frames, copy=True)

    def close(self) -> None:
        """Flush and close (the main thread, once the serve loop is over)."""
        os.write(self._stop_w, b"\1")
        self.join(5.0)
        for sock in (self.inbox, self.outbox):
            sock.close()
        self.ctx.term()


class LinkReader:
    """``read(deadline)`` on the requests the link thread relays, like ``QueueReader``."""

    def __init__(self, link: WorkerLink, interrupt_fds: Sequence[int],
                 on_interrupt: Callable[[], None]) -> None:
        self._sock = link.inbox
        self._fds = list(interrupt_fds)
        self._on_interrupt = on_interrupt
        self._poller = poller_for(self._sock, self._fds)

    def read(self, deadline: float | None, hold: bool = False) -> tuple[int, bytes] | None:
        """``hold`` is accepted for the protocol; a worker reads each request once."""
        while True:
            timeout = None if deadline is None else deadline - time.monotonic()
            if timeout is not None and timeout <= 0:
                return None
            events = dict(self._poller.poll(poll_ms(timeout)))
            if any(fd in events for fd in self._fds):
                self._on_interrupt()
            if self._sock in events:
                return self._take()

    def ack(self) -> None:
        """Nothing is held (see ``read``)."""

    def _take(self) -> tuple[int, bytes]:
        frames = self._sock.recv_multipart(copy=False)
        if frames[0].bytes == _DAMAGED:
            msg_id = int.from_bytes(frames[1].bytes, "little")
            what = frames[2].bytes.decode()
            raise CorruptMessageError(
                f"message {msg_id} on the TCP link was rejected ({what})",
                msg_id=msg_id, exc_type="AuthenticationError", exc_message=what,
            )
        msg_id = parse_head(frames[0].buffer)[2]
        return msg_id, relayed_payload(frames)


class LinkWriter:
    """``write(msg_id, parts, deadline)`` that seals a reply and hands it to the link thread."""

    def __init__(self, link: WorkerLink) -> None:
        self._link = link

    def write(self, msg_id: int, parts: Sequence[memoryview | bytes], deadline: float | None) -> None:
        self._link.send(DATA, msg_id, parts)


def remote_worker_main(boot: RemoteBootstrap) -> None:
    """Process entry point of a remote worker."""
    state = prepare_process(boot)
    link = WorkerLink(boot, state)
    link.start()
    try:
        reader = LinkReader(link, [boot.death.fileno(), link.gone_r], leave_loop)
        proc = WorkerProc(boot, state, (reader, LinkWriter(link)))
    except BaseException as exc:  # noqa: BLE001 - any failure must reach the driver
        link.send(START_ERROR, 0, [pickle.dumps(RemoteError.capture(exc))])
        link.close()
        sys.exit(EXIT_STARTUP_FAILED)
    link.send(READY, os.getpid())
    try:
        proc.run()
    finally:
        link.close()


# ---------------------------------------------------------------------- the node agent


def fetch_node_config(driver: str, node: int, secret: bytes, timeout: float) -> NodeConfig:
    """Say HELLO to the driver and return its CONFIG (authenticated), retrying until ``timeout``."""
    ctx = zmq.Context()
    sock = new_socket(ctx, zmq.DEALER)
    try:
        sock.setsockopt(zmq.ROUTING_ID, node_identity(node))
        present(sock, secret)
        sock.connect(f"tcp://{driver}")
        sock.send_multipart(seal(secret, HELLO, node, 0))
        if not sock.poll(poll_ms(timeout)):
            raise TimeoutError(f"no CONFIG from the driver at {driver} within {timeout:g} s "
                               "(is it running, and is the secret the same?)")
        while True:
            env = unseal(secret, sock.recv_multipart())
            if env.kind == CONFIG:
                config: NodeConfig = pickle.loads(env.payload())  # authenticated: from the driver
                return config
    finally:
        sock.close()
        ctx.term()  # before any fork: a child must not inherit a live ZeroMQ context


def run_node(driver: str, node: int, secret: bytes, connect_timeout: float) -> int:
    """Run node ``node``'s workers, one incarnation after another, until the driver says BYE
    or goes silent; the exit code says whether the last incarnation ended well."""
    from executor.tcp_agent import NodeAgent

    config: NodeConfig | None = fetch_node_config(driver, node, secret, connect_timeout)
    assert config is not None
    if not 1 <= node < config.cfg.nnodes:
        raise ValueError(f"node rank {node} is not in 1..{config.cfg.nnodes - 1}")
    importlib.import_module(config.cfg.worker.partition(":")[0])  # forked workers start loaded
    agent = NodeAgent(driver, node, secret)
    agent.install_signals()
    code = 0
    while config is not None:
        group = start_group(config, driver, secret, node)
        config = agent.serve(config, group)  # the next incarnation's, or None: leave
        code = group.stop()
    return code


class NodeGroup:
    """One incarnation's worker processes on this node, and the death pipe they watch."""

    def __init__(self, cfg: ExecutorConfig, ranks: list[int], processes: list[Any],
                 death_w: Connection) -> None:
        self.cfg, self.ranks, self.processes, self.death_w = cfg, ranks, processes, death_w

    @property
    def sentinels(self) -> list[int]:
        return [p.sentinel for p in self.processes if p.exitcode is None]

    def leave(self) -> None:
        """Close the death pipe: every worker of this group leaves (idempotent)."""
        if not self.death_w.closed:
            death_pipes.unregister(self.death_w.fileno())
            self.death_w.close()

    def stop(self) -> int:
        """Leave, grace, SIGTERM, SIGKILL, reap: nothing of this group stays; 0 if all
        ended normally."""
        self.leave()
        stop_processes([(rank, p, -1) for rank, p in zip(self.ranks, self.processes, strict=True)],
                       self.cfg.shutdown_grace, self.cfg.sigterm_grace)
        for p in self.processes:  # its sentinel can read EOF a moment before it is waitable:
            p.join(_REAP_S)       # stop_processes may return then, its exit code still unknown
        normal = (0, EXIT_PARENT_DIED, 128 + signal.SIGTERM, -signal.SIGTERM)
        ok = all(p.exitcode in normal for p in self.processes)
        for p in self.processes:
            p.close()
        return 0 if ok else 1


def start_group(config: NodeConfig, driver: str, secret: bytes, node: int) -> NodeGroup:
    """Fork one worker per rank of ``node`` for ``config``'s incarnation (no ZeroMQ context
    is open in this process now: a child must not inherit one)."""
    cfg = config.cfg
    method = "fork" if threading.active_count() == 1 else "forkserver"
    mp = multiprocessing.get_context(method)
    death_r, death_w = mp.Pipe(duplex=False)
    death_pipes.register(death_w.fileno())  # a worker never keeps it: the agent's death is EOF
    key = session_key(secret, config.incarnation, config.nonce)
    processes = [_start_remote(mp, config, driver, key, rank, death_r, method)
                 for rank in cfg.node_ranks(node)]
    death_r.close()
    log.info("node %d: incarnation %d: started ranks %s (pids %s)", node, config.incarnation,
             cfg.node_ranks(node), [p.pid for p in processes])
    return NodeGroup(cfg, cfg.node_ranks(node), processes, death_w)


def _start_remote(
    mp: Any, config: NodeConfig, driver: str, key: bytes, rank: int, death_r: Connection,
    method: str,
) -> Any:
    cfg = config.cfg
    ctx = WorkerContext(rank, cfg.world_size, cfg.tensor_parallel_size, cfg.pipeline_parallel_size,
                        config.init_method, dict(cfg.worker_kwargs), cfg.async_scheduling)
    boot = RemoteBootstrap(
        ctx=ctx, worker=cfg.worker, driver=driver, secret=key, incarnation=config.incarnation,
        heartbeat_interval=cfg.heartbeat_interval, node_timeout=cfg.node_timeout, death=death_r,
        start_method=method, thread_cap=cfg.thread_cap(), wait_policy=config.wait_policy,
        exit_grace_s=cfg.worker_exit_grace, trace=config.trace,
    )
    process = mp.Process(target=remote_worker_main, args=(boot,), name=f"faultlab-worker-{rank}",
                         daemon=True)
    process.start()
    return process
