"""The other nodes, as one incarnation of the executor sees them (``nnodes > 1`` only).

    MultiprocExecutor._start ──(nnodes > 1, imported here lazily)──► RemoteNodes.start(site)
        first time only, site.open ─► open_hub: secret (FAULTLAB_SECRET, else cfg.secret_file
            read or written 0600, else a fresh file in a private temp dir) ─► DriverHub thread
            bound to driver_host:port, kept for the executor's life (executor/remote_site.py)
        hub.begin(NodeConfig) ─► incarnation n: session key, RESTART to the agents
    collective_rpc ─► writer() ─► hub ─► remote ranks;   replies ─► readers() ─► ReplyCollector
    serve(on_lost): from now on a lost node calls on_lost(node, ranks, why), once
    ExecutorResources: stop() / close() ─► hub.end(n): BYE to incarnation n's workers

Invariants:
- Only this module (and the tcp modules below it) imports pyzmq: ``import executor`` does
  not load it, and a one-node executor never does.
- ``on_lost`` is held weakly (``weakref.WeakMethod``): the hub thread never keeps the
  executor alive.  A loss seen before ``serve`` is reported right after, on its own thread.
- ``stop``/``close`` end this incarnation only (idempotent); the site closes the hub.
- Everything read here is this incarnation's: pids and losses of another are not reported.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import tempfile
import threading
import weakref
from collections.abc import Callable, Sequence

from executor.config import ExecutorConfig
from executor.remote_site import RemoteSite
from executor.tcp_channels import TcpBroadcastWriter, TcpReplies
from executor.tcp_driver import DriverHub, LostCallback, NodeConfig
from executor.tcp_wire import read_secret_file, secret_from_env, write_secret_file
from executor.transport import MessageReader, MessageWriter
from executor.waiting import WaitPolicy

log = logging.getLogger("executor")


class RemoteNodes:
    """One incarnation's view of the hub that reaches the workers of nodes 1..nnodes-1."""

    def __init__(self, cfg: ExecutorConfig, hub: DriverHub, incarnation: int,
                 secret_file: str | None) -> None:
        self.cfg = cfg
        self._hub = hub
        self.incarnation = incarnation  # the hub's session number (start attempts, from 0)
        self.secret_file = secret_file  # None: the secret came from $FAULTLAB_SECRET
        self._replies: list[TcpReplies] = []

    @classmethod
    def start(cls, cfg: ExecutorConfig, init_method: str, policy: WaitPolicy,
              trace: tuple[int, int, int] | None, site: RemoteSite) -> RemoteNodes:
        """Open the site's hub if needed, then begin a new incarnation on it (RESTART to the
        agents that are already there; CONFIG to each that says HELLO)."""
        hub = site.open(cfg)
        incarnation = hub.begin(NodeConfig(cfg, init_method, policy, trace))
        return cls(cfg, hub, incarnation, site.secret_file)

    # ------------------------------------------------------------------ what the executor reads

    @property
    def address(self) -> str:
        return self._hub.address

    @property
    def rejected(self) -> int:
        """Messages that failed authentication and were dropped unread."""
        return self._hub.rejected

    @property
    def refused(self) -> int:
        """Connections refused at the hub's gate for a wrong connect token (tcp_gate.py)."""
        return self._hub.refused

    @property
    def stale(self) -> int:
        """Authentic messages of an older incarnation, dropped undelivered."""
        return self._hub.stale + sum(r.stale for r in self._replies)

    @property
    def lost(self) -> str | None:
        """Why a node was lost (the first loss of this incarnation), or None."""
        hub = self._hub
        return hub.lost if hub.incarnation == self.incarnation else None

    def pids(self) -> list[int]:
        """The remote ranks' pids in rank order (0 for one that has not said READY)."""
        pids = self._hub.pids if self._hub.incarnation == self.incarnation else {}
        return [pids.get(r, 0) for r in self.cfg.remote_ranks]

    # ------------------------------------------------------------------ start-up and serving

    def wait_ready(self, deadline: float, timeout: float) -> None:
        self._hub.wait_ready(deadline, timeout)

    def writer(self) -> MessageWriter:
        return TcpBroadcastWriter(self._hub, self.incarnation)

    def readers(self, interrupt_fds: Sequence[int],
                on_interrupt: Callable[[], None]) -> list[MessageReader]:
        """One reply reader per remote rank, in rank order."""
        replies = TcpReplies(self._hub, self.incarnation, interrupt_fds, on_interrupt)
        self._replies.append(replies)
        return [replies.reader(rank) for rank in self.cfg.remote_ranks]

    def serve(self, on_lost: Callable[[int, list[int], str], None]) -> None:
        """From now on a lost node calls the (bound method) ``on_lost``; before, start-up failed."""
        callback = weak_callback(on_lost)
        lost = self._hub.serve(self.incarnation, callback)
        if lost is not None:
            threading.Thread(target=callback, args=(0, [], lost), name="faultlab-node-lost").start()

    # ------------------------------------------------------------------ shutdown

    def stop(self) -> None:
        """This incarnation ends: BYE to its remote workers; any thread, any time.  The hub
        and the agents stay (executor/remote_site.py)."""
        self._hub.end(self.incarnation)

    def close(self) -> None:
        """Nothing of its own to release: the hub belongs to the executor's RemoteSite."""
        self._hub.end(self.incarnation)


def open_hub(cfg: ExecutorConfig) -> tuple[DriverHub, str | None, str | None]:
    """Resolve the secret, bind the socket remote workers connect to, start the hub thread:
    (hub, the secret's file or None, a temp dir made for it or None)."""
    secret, secret_file, secret_dir = _resolve_secret(cfg.secret_file)
    try:
        hub = DriverHub(cfg, secret)
    except BaseException:
        if secret_dir is not None:
            shutil.rmtree(secret_dir, ignore_errors=True)
        raise
    hub.start()
    log.info("executor: remote workers connect to %s (node ranks 1..%d; secret in %s)",
             hub.address, cfg.nnodes - 1, secret_file or "$FAULTLAB_SECRET")
    return hub, secret_file, secret_dir


def weak_callback(method: LostCallback) -> LostCallback:
    """``method`` (a bound method) as a callback that does not keep its object alive."""
    ref = weakref.WeakMethod(method)

    def call(node: int, ranks: list[int], why: str) -> None:
        bound = ref()
        if bound is not None:
            bound(node, ranks, why)

    return call


def _resolve_secret(path: str | None) -> tuple[bytes, str | None, str | None]:
    """(secret, its file or None, a temp dir we made for it or None).

    FAULTLAB_SECRET, else the configured file (read, or created), else a fresh private file."""
    env = secret_from_env()
    if env is not None:
        return env, None, None
    if path is not None and os.path.exists(path):
        return read_secret_file(path), path, None
    secret_dir = None
    if path is None:
        secret_dir = tempfile.mkdtemp(prefix="faultlab-secret-")
        path = os.path.join(secret_dir, "secret")
    secret = secrets.token_bytes(32)
    write_secret_file(path, secret)
    return secret, path, secret_dir
