"""The ray target's driver: the peer workload on one Ray actor per rank, on a local Ray
started by this driver (loopback only, no dashboard UI, usage stats and token files off).

    driver (ray.init) ──► gcs_server (ray_gcs) ─ raylet (ray_raylet) ─┬─ ray::Worker actor 0..n-1
                          dashboard.py API server (ray_dashboard)      │   (role worker, rank = index)
                          autoscaler monitor.py (ray_monitor)          ├─ ray::DashboardAgent
                          log_monitor.py (ray_log_monitor)             ├─ ray::RuntimeEnvAgent
                                                                       └─ ray::IDLE pool workers

A call is ``work.remote(i, rank)`` on every actor, awaited with ``ray.wait`` so the first
failure is reported when Ray raises it.  Actors keep Ray's defaults (``max_restarts=0``): a
dead actor stays dead, and every later call fails.  ``ray.shutdown()`` runs on every end the
driver lives through.

Observed (ray 2.60, two shared cores): ready after 3-8 s; a worker's SIGKILL or SIGTERM is
ActorDiedError within ~15 ms, naming the actor, its pid and the exit (SIGTERM: "The process
receives a SIGTERM"); a SIGSTOPped actor is waited for without end, no error; after the
driver's SIGKILL gcs_server, raylet, monitors and dashboard go within 0.1 s, the actors
within ~2 s, the dashboard and runtime-env agents only after ~60 s (in the driver's session;
their /proc environment is overwritten by their title); the session directory under
$TMPDIR/ray (logs, sockets, ~220 KB) is never removed, not even by a clean shutdown.

    python -m chaos.targets.ray_driver SPEC_JSON
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import psutil

from chaos.targets import peer_workload as pw
from chaos.targets.base import WorkloadSpec
from chaos.targets.protocol import Reporter, call_value

# Set before ray is imported, so that every Ray process inherits them: Ray's single-node mode
# (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0: the node's address is 127.0.0.1, so gcs_server, the
# raylet, the agents and the workers listen on loopback only; without it they listen on
# every interface and ray.init turns 127.0.0.1 into the host's address), no usage-stats
# reporting, no ~/.ray/auth_token (a loopback-only cluster that lives for one run needs none).
RAY_ENV = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_AUTH_MODE": "disabled",
}
OBJECT_STORE_BYTES = 100 * 1024 * 1024
ROLE_BY_MARK = (  # (substring of the command line, role), first match wins
    ("ray/gcs/gcs_server", "ray_gcs"),
    ("ray/raylet/raylet", "ray_raylet"),
    ("dashboard/dashboard.py", "ray_dashboard"),
    ("autoscaler/_private/monitor.py", "ray_monitor"),
    ("log_monitor.py", "ray_log_monitor"),
    ("ray::DashboardAgent", "ray_dashboard_agent"),
    ("ray::RuntimeEnvAgent", "ray_runtime_env_agent"),
    ("ray::", "ray_pool_worker"),
)


class Worker:
    """One rank: an actor whose process is worker ``rank`` of the tree."""

    def pid(self) -> int:
        return os.getpid()

    def work(self, call_index: int, rank: int, call_s: float) -> int:
        time.sleep(call_s)
        return call_value(call_index, rank)


def start(spec: WorkloadSpec) -> tuple[list[Any], list[int]]:
    """ray.init, then one actor per rank; the actors and their pids, by rank."""
    import ray

    ray.init(num_cpus=spec.ranks, include_dashboard=False, log_to_driver=False,
             object_store_memory=OBJECT_STORE_BYTES, _node_ip_address="127.0.0.1")
    actor_class: Any = ray.remote(Worker)
    actors = [actor_class.remote() for _ in range(spec.ranks)]
    pids = ray.get([actor.pid.remote() for actor in actors], timeout=pw.call_timeout_s(spec))
    return actors, list(pids)


def run_call(actors: list[Any], spec: WorkloadSpec, index: int) -> list[int]:
    import ray

    refs = [actor.work.remote(index, rank, spec.call_s) for rank, actor in enumerate(actors)]
    deadline = time.monotonic() + pw.call_timeout_s(spec)
    pending = list(refs)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1,
                                  timeout=max(0.0, deadline - time.monotonic()))
        if not ready:
            raise pw.CallTimeout(f"{len(pending)} of {len(refs)} actors had no answer from "
                                 f"ray within {pw.call_timeout_s(spec)}s")
        ray.get(ready)  # raises RayActorError & co. as soon as one actor's task failed
    return list(ray.get(refs))


def role_of(proc: psutil.Process) -> str:
    cmd = pw.cmdline_text(proc)
    for mark, role in ROLE_BY_MARK:
        if mark in cmd:
            return role
    return "helper"


def ray_processes() -> list[psutil.Process]:
    """This run's Ray processes: the driver's descendants (the raylet's workers included)."""
    return pw.descendants()


def session_dir() -> str | None:
    import ray

    try:
        node = ray._private.worker._global_node
        return str(node.get_session_dir_path()) if node is not None else None
    except AttributeError:
        return None


def main(argv: list[str]) -> int:
    started = time.monotonic()
    spec = pw.load_spec(argv)
    reporter = Reporter()
    for key, value in RAY_ENV.items():  # before the import: ray reads some of them then
        os.environ.setdefault(key, value)
    import ray

    try:
        actors, worker_pids = start(spec)
        tree = pw.process_tree(worker_pids, ray_processes(), role_of)
        pw.report_ready(reporter, tree, started, executor="ray", version=ray.__version__,
                        session_dir=session_dir())
        pw.run_calls(spec, reporter, lambda index: run_call(actors, spec, index))
        reporter.done()
        pw.linger(spec)
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
