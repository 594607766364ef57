"""The remote nodes' hub, kept for the executor's whole life (``nnodes > 1``).

    MultiprocExecutor.__init__ ─► RemoteSite()          (nothing opened; pyzmq not loaded)
    each incarnation's _start  ─► site.open(cfg) ─► the DriverHub (made once: secret, port)
    ex.shutdown(), GC, exit    ─► release(res, site): the incarnation's resources, then
                                  site.close(): BYE to the agents, hub thread joined, sockets
                                  and the generated secret removed

Invariants:
- One hub per executor: the remote ``faultlab worker`` agents keep their link to it between
  incarnations, so a restart reaches them at the same address with the same secret.
- A failure ends an incarnation (its workers get BYE) but never the hub: the agents wait,
  heartbeating, for ``restart()`` or the executor's shutdown.
- ``close`` is idempotent and never needs the executor object (``weakref.finalize`` runs it).
"""

from __future__ import annotations

import shutil
import threading
from typing import TYPE_CHECKING

from executor.config import ExecutorConfig

if TYPE_CHECKING:  # pyzmq: loaded on open() only
    from executor.resources import ExecutorResources
    from executor.tcp_driver import DriverHub


class RemoteSite:
    """Holds the hub (once opened) and the secret it made, if it made one."""

    def __init__(self) -> None:
        self.hub: DriverHub | None = None
        self.secret_file: str | None = None  # None: the secret came from $FAULTLAB_SECRET
        self._secret_dir: str | None = None  # a private temp dir holding a generated secret
        self._lock = threading.Lock()

    def open(self, cfg: ExecutorConfig) -> DriverHub:
        """The hub, bound and started on first use."""
        with self._lock:
            if self.hub is None:
                from executor.remote_nodes import open_hub

                self.hub, self.secret_file, self._secret_dir = open_hub(cfg)
            return self.hub

    def close(self) -> None:
        """BYE to every agent and worker, join the hub thread, release sockets and secret."""
        with self._lock:
            hub, self.hub = self.hub, None
            secret_dir, self._secret_dir = self._secret_dir, None
        if hub is not None:
            hub.stop()
            if hub is not threading.current_thread():
                hub.join(5.0)
            hub.close()
        if secret_dir is not None:
            shutil.rmtree(secret_dir, ignore_errors=True)


def release(res: ExecutorResources, site: RemoteSite) -> None:
    """The executor's end: its current incarnation, then the hub (the finalizer's target)."""
    res.shutdown()
    if res.owned():
        site.close()
