"""The other nodes, as the executor sees them (``nnodes > 1`` only): one facade over the TCP hub.

    MultiprocExecutor._start ──(nnodes > 1, imported here lazily)──► RemoteNodes.start
        secret: FAULTLAB_SECRET, else cfg.secret_file (read, or written 0600), else a fresh
                file in a private temp dir ─► DriverHub thread bound to driver_host:port
    collective_rpc ─► writer() ─► hub ─► remote ranks;   replies ─► readers() ─► ReplyCollector
    serve(on_lost): from now on a lost node calls on_lost(node, ranks, why), once
    ExecutorResources: stop() (BYE, with the local workers' stop) ─► close() (sockets, secret dir)

Invariants:
- Only this module (and the tcp modules below it) imports pyzmq: ``import executor`` does
  not load it, and a one-node executor never does.
- ``on_lost`` is held weakly (``weakref.WeakMethod``): the hub thread never keeps the
  executor alive.  A loss seen before ``serve`` is reported right after, on its own thread.
- ``close`` is idempotent and removes the generated secret, if it made one.
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
from executor.tcp_driver import DriverHub, LostCallback, NodeConfig, TcpBroadcastWriter, TcpReplies
from executor.tcp_wire import read_secret_file, secret_from_env, write_secret_file
from executor.transport import MessageReader, MessageWriter
from executor.waiting import WaitPolicy

log = logging.getLogger("executor")


class RemoteNodes:
    """The TCP hub that reaches the workers of nodes 1..nnodes-1, and its secret."""

    def __init__(self, cfg: ExecutorConfig, hub: DriverHub, secret_file: str | None,
                 secret_dir: str | None) -> None:
        self.cfg = cfg
        self._hub = hub
        self.secret_file = secret_file  # None: the secret came from $FAULTLAB_SECRET
        self._secret_dir = secret_dir  # a private temp dir holding a generated secret file

    @classmethod
    def start(cls, cfg: ExecutorConfig, init_method: str, policy: WaitPolicy,
              trace: tuple[int, int, int] | None) -> RemoteNodes:
        """Resolve the secret, bind the socket remote workers connect to, start the hub."""
        secret, secret_file, secret_dir = _resolve_secret(cfg.secret_file)
        try:
            hub = DriverHub(cfg, secret, NodeConfig(cfg, init_method, policy, trace))
        except BaseException:
            if secret_dir is not None:
                shutil.rmtree(secret_dir, ignore_errors=True)
            raise
        hub.start()
        log.info("executor: remote workers connect to %s (node ranks 1..%d; secret in %s)",
                 hub.address, cfg.nnodes - 1, secret_file or "$FAULTLAB_SECRET")
        return cls(cfg, hub, secret_file, secret_dir)

    # ------------------------------------------------------------------ what the executor reads

    @property
    def address(self) -> str:
        return self._hub.address

    @property
    def rejected(self) -> int:
        """Messages that failed authentication and were dropped unread."""
        return self._hub.rejected

    @property
    def lost(self) -> str | None:
        """Why a node was lost (the first loss), or None."""
        return self._hub.lost

    def pids(self) -> list[int]:
        """The remote ranks' pids in rank order (0 for one that has not said READY)."""
        return [self._hub.pids.get(r, 0) for r in self.cfg.remote_ranks]

    # ------------------------------------------------------------------ start-up and serving

    def wait_ready(self, deadline: float, timeout: float) -> None:
        self._hub.wait_ready(deadline, timeout)

    def writer(self) -> MessageWriter:
        return TcpBroadcastWriter(self._hub)

    def readers(self, interrupt_fds: Sequence[int],
                on_interrupt: Callable[[], None]) -> list[MessageReader]:
        """One reply reader per remote rank, in rank order."""
        replies = TcpReplies(self._hub, interrupt_fds, on_interrupt)
        return [replies.reader(rank) for rank in self.cfg.remote_ranks]

    def serve(self, on_lost: Callable[[int, list[int], str], None]) -> None:
        """From now on a lost node calls the (bound method) ``on_lost``; before, start-up failed."""
        callback = weak_callback(on_lost)
        lost = self._hub.serve(callback)
        if lost is not None:
            threading.Thread(target=callback, args=(0, [], lost), name="faultlab-node-lost").start()

    # ------------------------------------------------------------------ shutdown

    def stop(self) -> None:
        """BYE to every remote worker; any thread, any time."""
        self._hub.stop()

    def close(self) -> None:
        """Join the hub thread and release its sockets and the generated secret."""
        hub = self._hub
        hub.stop()
        if hub is not threading.current_thread():
            hub.join(5.0)
        hub.close()
        if self._secret_dir is not None:
            shutil.rmtree(self._secret_dir, ignore_errors=True)
            self._secret_dir = None


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
