"""Which executor ``faultlab demo`` runs the model on: ``--backend shm`` (default, the
shared-memory ``MultiprocExecutor``) or ``--backend ray`` (``RayExecutor``).

    --backend ray, no --ray-address:  LocalRayCluster (head + 1 worker node on loopback,
                                      started here, ~10-40 s) ─► RayExecutor ─► actors
    --backend ray --ray-address H:P:  an existing Ray cluster ─► RayExecutor ─► actors

The engine, the model worker, the fault and the restart policy are the same objects on
either backend; a cluster started here is stopped when the demo ends, whatever ends it
(its node keepers see EOF when this process dies).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

BACKENDS = ("shm", "ray")
RAY_FAULTS = ("kill", "sigterm", "hang")  # queue damage hits the shm ring, which Ray has not


@contextlib.contextmanager
def open_executor(backend: str, cfg: Any, ray_address: str | None = None) -> Iterator[Any]:
    """The executor for ``backend``, shut down (and any cluster started for it stopped) after."""
    if backend == "shm":
        from executor import MultiprocExecutor

        with MultiprocExecutor(cfg) as executor:
            yield executor
        return
    from executor.ray_cluster import LocalRayCluster
    from executor.ray_executor import RayExecutor

    with contextlib.ExitStack() as stack:
        # Ray prints cluster errors (a worker died ...) on stdout, which is the demo's report
        # (--json: one object): while Ray runs they go to stderr with the progress lines.
        stack.enter_context(contextlib.redirect_stdout(sys.stderr))
        if ray_address is None:
            print("starting a local two-node Ray cluster ...", file=sys.stderr, flush=True)
            cluster = stack.enter_context(LocalRayCluster(nodes=2, cpus=max(1, cfg.world_size)))
            ray_address = cluster.address
            print(f"Ray cluster at {ray_address} ready in {cluster.startup_s:.1f}s",
                  file=sys.stderr, flush=True)
        with RayExecutor(cfg, address=ray_address) as executor:
            yield executor
