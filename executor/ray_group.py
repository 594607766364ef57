"""One incarnation of ``RayExecutor``'s workers: a placement group and one actor per rank.

    start(): placement group (world_size bundles of 1 CPU, one per node if it can)
        ─► RayWorkerActor per rank, in its bundle ─► info(): pid and node of each
        ─► free_port() on rank 0 (torch.distributed's rendezvous) ─► start(ctx) on every rank
        ─► watch() on every rank: a ref that only ever fails, when its actor dies
    RayReplyReader(rank): the ReplyCollector's reader for one rank (executor/calls.py): the
        rank's deliver() refs in submission order; waits on the head ref and every watch ref
    stop(): ray.kill every actor, remove the placement group, wait (bounded) for the deaths

Invariants:
- A reader never waits without the watch refs: any actor's death wakes every waiter at
  once, and the reader reports it (``on_death``) before it raises.
- Refs are appended under the executor's send lock and popped only by the collector (its
  lock held), so each rank's refs are read strictly in submission order.
- ``stop`` is idempotent and bounded; after it no actor of this group is alive (Ray's word:
  their watch refs have all failed) or the grace has passed.
"""

from __future__ import annotations

import collections
import os
import sys
import time
from collections.abc import Callable
from typing import Any, NoReturn

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from executor.config import ExecutorConfig
from executor.errors import ExecutorFailedError, WorkerStartupError
from executor.ray_actor import RayWorkerActor
from executor.ray_cluster import NODE_RESOURCE
from executor.worker_base import WorkerContext

CONTROL, WATCH = "control", "watch"  # the actor's concurrency groups besides the default
_ENV_PREFIXES = ("FAULTLAB_", "OTEL_", "TRACEPARENT")  # what workers inherit from the driver
_actor_class: Any = None
DeathHandler = Callable[[int, BaseException, int], ExecutorFailedError]


def actor_class() -> Any:
    global _actor_class
    if _actor_class is None:
        _actor_class = ray.remote(concurrency_groups={CONTROL: 2, WATCH: 1})(RayWorkerActor)  # type: ignore[call-overload]
    return _actor_class


class RayGroup:
    """The actors of one incarnation; ``pids``, ``node_ids`` and ``node_names`` by rank."""

    def __init__(self, cfg: ExecutorConfig) -> None:
        self.cfg = cfg
        self.pg: Any = None
        self.actors: list[Any] = []
        self.pids: list[int] = []
        self.node_ids: list[str] = []
        self.node_names: list[str] = []
        self.watch_refs: list[Any] = []
        self.stopping = False

    # ------------------------------------------------------------------ start-up

    def start(self, deadline: float) -> None:
        cfg = self.cfg
        n = cfg.world_size
        # One rank per node while there are enough nodes (STRICT_SPREAD), else as spread as
        # Ray can (SPREAD): a TP group then spans nodes, as it would on a real cluster.
        alive = len([node for node in ray.nodes() if node["Alive"]])  # type: ignore[no-untyped-call]
        self.pg = placement_group([{"CPU": 1}] * n,
                                  strategy="STRICT_SPREAD" if n <= alive else "SPREAD")
        ready, _ = ray.wait([self.pg.ready()], timeout=_left(deadline))
        if not ready:
            cpus = ray.cluster_resources().get("CPU", 0)  # type: ignore[no-untyped-call]
            raise WorkerStartupError(
                f"Ray could not place {n} workers (1 CPU each) within the start-up timeout: "
                f"the cluster has {cpus:g} CPUs")
        env = {k: v for k, v in os.environ.items() if k.startswith(_ENV_PREFIXES)}
        cls = actor_class()
        self.actors = [cls.options(
            num_cpus=1, max_restarts=0, max_concurrency=1,
            scheduling_strategy=PlacementGroupSchedulingStrategy(self.pg, rank),
        ).remote(list(sys.path), env) for rank in range(n)]
        infos = self._get([a.info.options(concurrency_group=CONTROL).remote() for a in self.actors],
                          deadline, "report its pid")
        self.pids = [pid for pid, _ in infos]
        self.node_ids = [node for _, node in infos]
        self.node_names = node_names(self.node_ids)
        port = self._get([self.actors[0].free_port.options(concurrency_group=CONTROL).remote()],
                         deadline, "pick a port")[0]
        init_method = f"tcp://{node_address(self.node_ids[0])}:{port}"
        starts = [a.start.remote(self._ctx(rank, init_method), cfg.worker)
                  for rank, a in enumerate(self.actors)]
        self.watch_refs = [a.watch.options(concurrency_group=WATCH).remote() for a in self.actors]
        self._get(starts, deadline, "build its worker")

    def _ctx(self, rank: int, init_method: str) -> WorkerContext:
        cfg = self.cfg
        # async_scheduling: Ray's task results are already asynchronous to the driver; the
        # worker replies inline (a reply thread would answer after deliver() returned).
        return WorkerContext(rank, cfg.world_size, cfg.tensor_parallel_size,
                             cfg.pipeline_parallel_size, init_method, cfg.worker_kwargs, False)

    def _get(self, refs: list[Any], deadline: float, what: str) -> list[Any]:
        try:
            return list(ray.get(refs, timeout=_left(deadline)))
        except GetTimeoutError:
            raise WorkerStartupError(f"a Ray worker did not {what} within the start-up "
                                     f"timeout ({self.cfg.startup_timeout:g} s)") from None
        except RayError as exc:
            raise WorkerStartupError(f"a Ray worker failed to {what}: {exc}") from None

    # ------------------------------------------------------------------ shutdown

    def stop(self, grace: float) -> None:
        if self.stopping:
            return  # idempotent; and Ray may be disconnected by now: never call it again
        self.stopping = True
        for actor in self.actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already dead, or Ray is going away
                pass
        if self.watch_refs:
            ray.wait(self.watch_refs, num_returns=len(self.watch_refs), timeout=grace)
        if self.pg is not None:
            try:
                remove_placement_group(self.pg)
            except Exception:  # noqa: BLE001 - idempotent
                pass
            self.pg = None
        self.actors = []

    # ------------------------------------------------------------------ deaths

    def describe_death(self, rank: int, exc: BaseException) -> ExecutorFailedError:
        """The error every call gets once rank ``rank``'s actor died: rank, pid and node."""
        node_id, name = self.node_ids[rank], self.node_names[rank]
        node_dead = not node_alive(node_id)
        cause = _ray_cause(exc)
        where = f"Ray node {name} ({node_id[:12]})"
        what = f"{where} died with it" if node_dead else f"on {where}"
        index = int(name[4:]) if name.startswith("node") and name[4:].isdigit() else None
        return ExecutorFailedError(
            f"worker rank {rank} (pid {self.pids[rank]}) died, {what}: {cause}; the executor "
            "has shut down and every pending call failed", rank=rank, pid=self.pids[rank],
            node=index, ranks=[r for r, n in enumerate(self.node_ids) if n == node_id],
        )


class RayReplyReader:
    """A ``MessageReader`` (executor/transport.py) over one rank's ``deliver`` refs."""

    def __init__(self, rank: int, group: RayGroup, on_death: DeathHandler) -> None:
        self.rank = rank
        self.group = group
        self.refs: collections.deque[tuple[int, Any]] = collections.deque()
        self._held: tuple[int, bytes] | None = None
        self._on_death = on_death

    def push(self, msg_id: int, ref: Any) -> None:
        self.refs.append((msg_id, ref))

    def read(self, deadline: float | None, hold: bool = False) -> tuple[int, bytes] | None:
        if self._held is not None:
            return self._held
        msg_id, ref = self.refs[0]
        watch = self.group.watch_refs
        timeout = None if deadline is None else _left(deadline)
        ready, _ = ray.wait([ref, *watch], num_returns=1, timeout=timeout)
        if not ready:
            return None
        if ref in ready or ray.wait([ref], timeout=0)[0]:  # a reply that came with a death: ours
            return self._take(msg_id, ref)
        self._report(watch.index(ready[0]), ready[0])

    def _take(self, msg_id: int, ref: Any) -> tuple[int, bytes] | None:
        try:
            frame = ray.get(ref)
        except RayActorError as exc:
            raise self._on_death(self.rank, exc, time.time_ns()) from None
        if frame is None:  # never: only replying ranks' refs are pushed
            raise ExecutorFailedError(f"rank {self.rank} sent no reply to call {msg_id}")
        self._held = (msg_id, frame)
        return self._held

    def _report(self, rank: int, watch_ref: Any) -> NoReturn:
        """Rank ``rank``'s actor died: raise what ``on_death`` makes of it."""
        try:
            ray.get(watch_ref)
        except RayError as exc:
            raise self._on_death(rank, exc, time.time_ns()) from None
        raise ExecutorFailedError(f"rank {rank}'s watch ended without its actor dying")

    def ack(self) -> None:
        self._held = None
        self.refs.popleft()


def node_names(node_ids: list[str]) -> list[str]:
    """Each node's ``faultlab_node_K`` resource as ``nodeK``, else its id's first 12 digits."""
    names = {}
    for node in ray.nodes():  # type: ignore[no-untyped-call]
        marks = [k for k in node.get("Resources", {}) if k.startswith(NODE_RESOURCE[:-2])]
        names[node["NodeID"]] = f"node{marks[0][len(NODE_RESOURCE) - 2:]}" if marks else node["NodeID"][:12]
    return [names.get(n, n[:12]) for n in node_ids]


def node_address(node_id: str) -> str:
    for node in ray.nodes():  # type: ignore[no-untyped-call]
        if node["NodeID"] == node_id:
            return str(node["NodeManagerAddress"])
    return "127.0.0.1"


def node_alive(node_id: str) -> bool:
    for node in ray.nodes():  # type: ignore[no-untyped-call]
        if node["NodeID"] == node_id:
            return bool(node["Alive"])
    return False


def _ray_cause(exc: BaseException) -> str:
    """Ray's own words for a death, on one line, from its "because" on, short."""
    text = " ".join(str(exc).split())
    for mark in ("The actor is dead because", "The actor died because"):
        if mark in text:
            text = "Ray says: " + text[text.index(mark):]
            break
    return text if len(text) <= 240 else text[:240] + " ..."


def _left(deadline: float) -> float:
    return max(0.0, deadline - time.monotonic())
