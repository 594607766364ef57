"""What a swarm scenario's faults run inside: plain calls, an edge workload, two nodes, or a
driver that is killed mid-call.  One is drawn per seed (chaos.swarm.draw), by weight.

    seed's rng ──pick(rng)──► Surrounding
        "calls"            the drawn calls, the drawn faults (most runs)
        "edge:NAME"        an edge workload of chaos.edge_workloads (bursts, raising
                           callbacks and aggregators, hostile values, a low fd limit, 1,100
                           fds held, Ctrl-C mid-stream, a Ctrl-C at every point of a call,
                           a memory cap) in place of the calls, with no fault: each judges
                           its calls by its own expectations (``check``), which a fault would
                           change
        "nodes"            the drawn calls on two nodes (rank 1 behind a ``faultlab worker``
                           agent on loopback), at most one ``kill_node`` (kill or cut_link)
        "outsider_flood"   two nodes, and a peer without the secret flooding the driver's
                           node port beside authentic calls (chaos.nodes)
        "driver_killed"    the drawn calls (and half the time the faults), then a long call
                           (a sleep, or C code holding the GIL) during which the driver is
                           SIGKILLed (the run goes through a driver subprocess,
                           chaos.driver_run); its deadline is LAST_CALLS' unless the sleeps
                           queued before it (a stubborn worker's 30 s) need more: then
                           those sleeps, its own and LAST_SLACK_S (the fault-free model of
                           chaos.swarm holds for it too)
        "small_ring"       the drawn calls and faults, every call non_block, on queues of
                           2 chunks: the request ring is full behind any call slower than
                           the next two, so the writer waits on its readers (and judges them)
    Surrounding.shape(rng, calls, faults) ──► (workload, calls, faults, extra config)

Invariants: the same rng state gives the same shape (no clock, no environment); every shape
is a scenario the suites could hold (TOML-able), so replay reruns it; a shape that has no
drawn calls has its own hang bound, ``workload_bound_s(workload)``.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from typing import Any

from chaos.faults import NODE_MODES, Fault, KillDriver, KillNode
from chaos.workloads import CallSpec

NODES = {"nnodes": 2, "heartbeat_interval": 0.1, "node_timeout": 1.0}
KILL_NODE_P = 0.6  # a nodes run has a node fault this often
SMALL_RING = {"n_chunks": 2}  # full after two unread messages (the default is 8)
# The driver's last call, in flight when it is killed: the workers must see the death pipe
# while asleep in Python, or while their main thread holds the GIL in C code.
LAST_CALLS = (CallSpec("sleep", (30.0,), 40.0), CallSpec("hold_gil", (30.0,), 40.0))
LAST_SLACK_S = 1.0
# Methods whose first argument is the seconds they keep a worker busy (chaos.stubborn's too).
SLEEPERS = ("sleep", "hold_gil", "chaos.stubborn:sleep")
KEEP_FAULTS_P = 0.5  # a driver_killed run keeps its drawn faults this often
EDGE_BOUND_S = 90.0  # an edge workload has hung (the suites give 60 s; the sweep more)
SWEEP_BOUND_S = 200.0  # interrupt_sweep: three sweeps of up to 30 s each, then a call

Shape = tuple[str, tuple[CallSpec, ...], tuple[Fault, ...], dict[str, Any]]
Shaper = Callable[[random.Random, tuple[CallSpec, ...], tuple[Fault, ...]], Shape]


def sleeps_s(call: CallSpec) -> float:
    """How long ``call`` keeps its worker busy with no fault (its sleep; 0 for the rest)."""
    return float(call.args[0]) if call.method in SLEEPERS else 0.0


def _calls(rng: random.Random, calls: tuple[CallSpec, ...], faults: tuple[Fault, ...]) -> Shape:
    return "standard", calls, faults, {}


def _edge(name: str) -> Shaper:
    def shape(rng: random.Random, calls: tuple[CallSpec, ...], faults: tuple[Fault, ...]) -> Shape:
        return name, (), (), {}
    return shape


def _nodes(rng: random.Random, calls: tuple[CallSpec, ...], faults: tuple[Fault, ...]) -> Shape:
    if rng.random() >= KILL_NODE_P:
        return "standard", calls, (), dict(NODES)
    k = rng.randrange(len(calls))
    method = calls[k].method
    nth = sum(c.method == method for c in calls[:k + 1])
    node = KillNode(node=1, mode=rng.choice(NODE_MODES), on_call=(method, nth))
    return "standard", calls, (node,), dict(NODES)


def _small_ring(rng: random.Random, calls: tuple[CallSpec, ...],
                faults: tuple[Fault, ...]) -> Shape:
    spread = tuple(dataclasses.replace(c, non_block=True) for c in calls)
    return "standard", spread, faults, dict(SMALL_RING)


def _flood(rng: random.Random, calls: tuple[CallSpec, ...], faults: tuple[Fault, ...]) -> Shape:
    return "chaos.nodes:outsider_flood", (), (), dict(NODES)


def _driver_killed(rng: random.Random, calls: tuple[CallSpec, ...],
                   faults: tuple[Fault, ...]) -> Shape:
    last = rng.choice(LAST_CALLS)
    queued = sum(sleeps_s(c) for c in calls)
    needed = round(queued + sleeps_s(last) + LAST_SLACK_S, 4)
    if last.timeout is not None and last.timeout < needed:  # behind a stubborn worker's sleep
        last = dataclasses.replace(last, timeout=needed)
    nth = sum(c.method == last.method for c in calls) + 1
    kill = KillDriver(on_call=(last.method, nth))
    kept = faults if rng.random() < KEEP_FAULTS_P else ()  # a fatal one would end the run first
    return "standard", (*calls, last), (*kept, kill), {}


@dataclasses.dataclass(frozen=True)
class Surrounding:
    name: str
    weight: float
    shape: Shaper


def workload_bound_s(workload: str) -> float:
    """When a named workload (one with no drawn calls) has hung."""
    return SWEEP_BOUND_S if workload == "interrupt_sweep" else EDGE_BOUND_S


EDGE_WEIGHTS = {"burst": 0.03, "callback_chaos": 0.03, "done_callbacks": 0.03,
                "failure_callbacks": 0.03, "hostile_values": 0.03, "fd_limit": 0.02,
                "fd_pressure": 0.02, "interrupt_stream": 0.02, "interrupt_sweep": 0.015,
                "memory_cap": 0.015, "interrupt_publish": 0.03}
SURROUNDINGS: tuple[Surrounding, ...] = (
    Surrounding("calls", 0.51, _calls),
    Surrounding("small_ring", 0.08, _small_ring),
    Surrounding("nodes", 0.07, _nodes),
    Surrounding("outsider_flood", 0.03, _flood),
    Surrounding("driver_killed", 0.08, _driver_killed),
    *(Surrounding(f"edge:{name}", w, _edge(name)) for name, w in EDGE_WEIGHTS.items()),
)


def pick(rng: random.Random) -> Surrounding:
    return rng.choices(SURROUNDINGS, weights=[s.weight for s in SURROUNDINGS])[0]
