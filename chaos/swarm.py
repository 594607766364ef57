"""Swarm fault activation: one seed picks which fault sites are on, how often they fire, and
the calls they hit, so that every explored scenario is a different corner of the fault space
and replays exactly from its seed (FoundationDB's BUGGIFY, for our fault kinds).

    seed ──random.Random("faultlab-swarm:SEED")──► Swarm
        sites:       every (kind, phase, variant) of SITES, each on with ACTIVE_P (1/4)
        firing:      each active site fires with a probability drawn from FIRE_P, per call
                     of the method it watches (FaultPlan draws the call numbers from the seed);
                     what surrounds the driver (TIMED) fires once, in the first 0.15 s
        faults:      at most MAX_FAULTS of the active sites, each on a drawn rank
        calls:       3 .. MAX_CALLS calls with deadlines (echo with unique payloads, sleeps
                     slower or faster than their deadline, get_rank, fail), some non_block;
                     an echo is BIG_PAYLOAD (several chunks) with BIG_ECHO_P, and every echo
                     is when a kill at mid_reply is drawn (it fires only inside such a reply)
                     with STUBBORN_P a last call that leaves a worker only SIGKILL ends
                     (chaos.stubborn: the "stubborn_worker" site)
        start method fork, forkserver or spawn
        surrounding  what the faults run inside (chaos.swarm_surroundings): the calls (most
                     runs), an edge workload, two nodes, an outsider's flood, a killed driver
    one seed in PAIR_EVERY (seed % PAIR_EVERY == PAIR_EVERY - 1) draws a PAIR instead:
        pair:        PAIRS[(seed // PAIR_EVERY) % len(PAIRS)]: two damaging kinds, in a fixed
                     rotation (seeds 4, 9, 14, ... walk every pair in turn)
        sites:       the pair's v-th visit (v = seed // (PAIR_EVERY * len(PAIRS))) takes the
                     v-th of its combinations in a fixed shuffle (``pair_combination``): one
                     site of each kind (a site that fires on any call), the two ``near`` in
                     the call (their points within PAIR_WINDOW, ``moment``: ``pair_sites``),
                     on two ranks, the first's rank part of the combination; so every
                     combination of a pair comes once in as many visits as it has
        k:           from random.Random("faultlab-swarm-pair:SEED"): both faults
                     ``on_call=("*", k)`` for one early k (1 or 2): both fire, in one call's
                     window, unless the first ends the run before the second's point
        calls, start method: as above; the surrounding is "calls"
    Swarm.scenario(executor) ──► chaos.suites.Scenario (a TOML-able scenario; replay reruns it)

The fault-free deadline model: with no fault, every call but a late one meets its deadline.
A call's deadline is DEADLINE_SLACK_S plus every sleep queued before it (``_calls``);
``deadline_misses`` checks a schedule against the model independently (at least
FAULT_FREE_MARGIN_S beyond the sleeps queued before a call and its own; a late call's deadline
short of its own sleep), and ``draw`` raises AssertionError on a schedule that breaks it.

Invariants: a seed draws the same swarm in any process (no clock, no environment, no state of
the exploration); a seed that draws no pair draws exactly what it drew before pairs existed
(the pair gate is the seed's residue, the pair's own draws a separate stream), but for a
driver_killed run with a stubborn worker, whose last call's deadline now keeps the model.
A pair seed that explore gives to the recovery family first (chaos.swarm_recovery, about 1
in 10) is not run as a pair: the rotation moves on.

A site is a kind at one of its phases, plus a variant where the kind has modes (the queue
and mode of ``corrupt_queue``, the mode of ``fork_in_driver``...).  Every fault may not fire
(its drawn calls may lie past the workload): ``may_not_fire`` lists them all, and the
coverage report counts what did.  ``kill_driver`` and ``kill_node`` are not sites: the
surroundings "driver_killed" and "nodes" bring them, with what they need (a long last call,
a second node).  Left out: ``starve_memory`` (a shared machine).
"""

from __future__ import annotations

import dataclasses
import itertools
import random
from typing import Any

from chaos.faults import (
    CORRUPT_MODES,
    FORK_MODES,
    INTERRUPT_PHASES,
    MID_REPLY,
    QUEUES,
    REAPER_MODES,
    SIGNAL,
    WORKER_PHASES,
    Fault,
    fault_from_dict,
)
from chaos.suites import Scenario
from chaos.swarm_surroundings import SLEEPERS, pick, sleeps_s
from chaos.workloads import CallSpec

ACTIVE_P = 0.25  # each site is on in a run with this probability
FIRE_P = (0.1, 0.25, 0.5, 0.75)  # an active site fires with one of these per call it watches
MAX_FAULTS = 3
MAX_CALLS = 10
WORLD_SIZE = 2
# Fired by time, from the injector's thread (as a program's other thread would), never on a
# call: a call-triggered fault runs inside the driver's after_enqueue failpoint, in the
# executor's send path, and a fork there hung the workload (seed 141 before this rule).
TIMED = frozenset({"fork_in_driver", "outside_reaper", "starve_cpu"})
STUBBORN_P = 0.15
STUBBORN = CallSpec("chaos.stubborn:sleep", (30.0,), 0.2, True)
START_METHODS = ("fork", "fork", "fork", "forkserver", "spawn")  # fork starts fastest
# An echo of several chunks (3 of the default 1 MiB): rare, and every echo of a run with a
# kill at mid_reply, which fires only inside such a reply.
BIG_PAYLOAD = 3 << 20
BIG_ECHO_P = 0.05
METHODS = ("echo", "sleep", "get_rank", "fail")
DEADLINE_SLACK_S = 1.0  # a call's deadline beyond the sleeps queued before it
FAULT_FREE_MARGIN_S = 0.5  # the least a fault-free call has beyond its queued and own sleeps
# Two-fault pairs: the kinds that end or damage a call, each pair of two of them (and the
# worker kinds twice, one per rank), in a fixed rotation order.
PAIR_EVERY = 5
PAIR_CALLS = 2  # both faults of a pair hit call k of any method, k in 1..PAIR_CALLS
# A pair's two points at most this far apart in a call (``moment``): a fatal fault well
# before the other's point ends the call first (a damaged request is never executed; a
# worker killed before unpickling leaves no reply to damage).  Measured on the first two
# rotations (50 pair seeds, the real executor): 62 % of pairs landed with a window of 3 and
# no rule for the send, 84 % with these rules (24 of the 25 pairs).
PAIR_WINDOW = 2
PAIR_KINDS = ("term_worker", "corrupt_queue", "kill_worker", "exit_worker", "hang_worker",
              "raise_in_worker", "interrupt_driver")
TWICE = ("kill_worker", "term_worker", "exit_worker", "hang_worker")
PAIRS: tuple[tuple[str, str], ...] = (*itertools.combinations(PAIR_KINDS, 2),
                                      *((k, k) for k in TWICE))
CONFIG = {"tensor_parallel_size": WORLD_SIZE, "shutdown_grace": 0.3, "sigterm_grace": 0.3}


def _sites() -> list[dict[str, Any]]:
    """Every fault site the swarm may switch on: a fault's fields except rank and trigger."""
    sites: list[dict[str, Any]] = []
    for kind in ("kill_worker", "term_worker"):
        sites += [{"kind": kind, "phase": p} for p in (SIGNAL, *WORKER_PHASES)]
    sites += [{"kind": "hang_worker", "phase": p, "duration": d}
              for p in (SIGNAL, *WORKER_PHASES) for d in (0.3, None)]
    sites += [{"kind": "resume_worker"}]
    sites += [{"kind": "slow_worker", "phase": p, "delay": 0.1} for p in WORKER_PHASES]
    sites += [{"kind": "raise_in_worker", "phase": p} for p in WORKER_PHASES]
    sites += [{"kind": "corrupt_queue", "queue": q, "mode": m} for q in QUEUES for m in CORRUPT_MODES]
    sites += [{"kind": "interrupt_driver", "phase": p} for p in (SIGNAL, *INTERRUPT_PHASES)]
    sites += [{"kind": "fork_in_driver", "mode": m, "duration": 0.3} for m in FORK_MODES]
    sites += [{"kind": "fork_in_worker", "phase": "before_execute", "duration": 0.5}]
    sites += [{"kind": "outside_reaper", "mode": m} for m in REAPER_MODES]
    sites += [{"kind": "starve_cpu", "duration": 0.3, "processes": 1}]
    sites += [{"kind": kind, "phase": MID_REPLY} for kind in ("kill_worker", "term_worker")]
    sites += [{"kind": "exit_worker", "phase": p} for p in (*WORKER_PHASES, MID_REPLY)]  # os._exit(0)
    return sites


SITES: tuple[dict[str, Any], ...] = tuple(_sites())
# A pair's sites fire on any call: no reply or request of several chunks needed.
_NEEDS_CHUNKS = frozenset({MID_REPLY, "mid_request"})
PAIR_SITES: dict[str, tuple[dict[str, Any], ...]] = {
    kind: tuple(s for s in SITES if s["kind"] == kind and s.get("phase") not in _NEEDS_CHUNKS)
    for kind in PAIR_KINDS}


def pair_cell(a: str, b: str) -> str:
    """The coverage cell of two fault kinds that landed in one run: "pair:A+B", sorted."""
    return "pair:" + "+".join(sorted((a, b)))


def site_name(site: dict[str, Any]) -> str:
    """"kill_worker@before_reply", "corrupt_queue@rpc/flip_payload", ..."""
    extra = [str(site[k]) for k in ("phase", "queue", "mode") if k in site]
    return str(site["kind"]) + ("@" + "/".join(extra) if extra else "")


_SITE_KEYS = {site["kind"]: tuple(k for k in ("phase", "queue", "mode") if k in site) for site in SITES}


def fault_site(fault: Fault) -> str:
    """The site name of a fault (the swarm's, or one written by hand)."""
    keys = _SITE_KEYS.get(fault.kind, ())
    return site_name({"kind": fault.kind, **{k: getattr(fault, k) for k in keys}})


@dataclasses.dataclass(frozen=True)
class Swarm:
    """What one seed switched on, and the scenario it makes."""

    seed: int
    active: tuple[tuple[str, float], ...]  # (site name, firing probability), in SITES order
    faults: tuple[Fault, ...]
    calls: tuple[CallSpec, ...]
    start_method: str
    surrounding: str = "calls"
    workload: str = "standard"  # an edge or node workload when ``calls`` is empty
    config: tuple[tuple[str, Any], ...] = ()  # what the surrounding adds (two nodes)
    pair: tuple[str, ...] = ()  # the two kinds of a pair seed (PAIRS), else ()

    def to_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "active": dict(self.active), "start_method": self.start_method,
                "surrounding": self.surrounding, "workload": self.workload,
                "pair": list(self.pair),
                "config": dict(self.config), "faults": [f.to_dict() for f in self.faults],
                "calls": [c.to_dict() for c in self.calls]}

    def scenario(self, executor: str = "") -> Scenario:
        config = {**CONFIG, "start_method": self.start_method, **dict(self.config)}
        return Scenario(f"swarm-{self.seed}", config, self.faults, self.workload, self.calls,
                        "auto", tuple(range(len(self.faults))), executor)


def draw(seed: int) -> Swarm:
    """The swarm of ``seed`` (the same seed, the same swarm, in any process)."""
    rng = random.Random(f"faultlab-swarm:{seed}")
    active = [(site, rng.choice(FIRE_P)) for site in SITES if rng.random() < ACTIVE_P]
    calls = _calls(rng, seed, rng.randint(3, MAX_CALLS))
    pair = pair_of(seed)
    if pair is not None:
        return _checked(_pair_swarm(seed, pair, calls))
    stubborn = rng.random() < STUBBORN_P
    chosen = rng.sample(active, min(len(active), rng.randint(1, MAX_FAULTS))) if active else []
    faults = tuple(_fault(rng, site, p, calls) for site, p in chosen)
    if any(f.phase == MID_REPLY for f in faults):
        calls = tuple(_big(c) if c.method == "echo" else c for c in calls)
    start_method = rng.choice(START_METHODS)
    around = pick(rng)
    stubborn = stubborn and around.name in ("calls", "driver_killed")
    calls += (STUBBORN,) if stubborn else ()
    workload, calls, faults, config = around.shape(rng, calls, faults)
    names = [(site_name(s), p) for s, p in active] + ([("stubborn_worker", 1.0)] if stubborn else [])
    return _checked(Swarm(seed, tuple(names), faults, calls, start_method, around.name, workload,
                          tuple(sorted(config.items()))))


def pair_of(seed: int) -> tuple[str, str] | None:
    """The two fault kinds ``seed`` draws together, or None (the seed's residue alone)."""
    if seed % PAIR_EVERY != PAIR_EVERY - 1:
        return None
    return PAIRS[(seed // PAIR_EVERY) % len(PAIRS)]


def moment(site: dict[str, Any]) -> int:
    """Where in one call a site's point comes, in order: the driver's send or a signal at
    the call's dispatch (0), the worker's points (1-8, its reply published at 7), the
    driver's read of the reply (9)."""
    if site["kind"] == "corrupt_queue":
        return 7 if site["queue"] == "reply" else 0
    return _MOMENTS.get(site.get("phase") or SIGNAL, 0)


_MOMENTS = {SIGNAL: 0, "mid_request": 0, "before_publish": 0, "after_written": 0,
            **{p: i + 1 for i, p in enumerate(WORKER_PHASES)}, MID_REPLY: 7,
            "after_reply": 8, "before_unpickle_reply": 9}


def _at_send(site: dict[str, Any]) -> bool:
    """A point in the driver's send of the request: the call may never reach a worker."""
    return moment(site) == 0 and site.get("phase") != SIGNAL


def near(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Two sites whose points come close enough in one call that both land (PAIR_WINDOW);
    a point in the driver's send only with another there or a signal at dispatch."""
    if _at_send(a) or _at_send(b):
        return all(_at_send(s) or s.get("phase") == SIGNAL for s in (a, b))
    return abs(moment(a) - moment(b)) <= PAIR_WINDOW


def pair_sites(pair: tuple[str, str]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Every two sites a pair of kinds may draw: one of each kind, ``near`` each other."""
    return [(a, b) for a in PAIR_SITES[pair[0]] for b in PAIR_SITES[pair[1]] if near(a, b)]


def _pair_swarm(seed: int, pair: tuple[str, str], calls: tuple[CallSpec, ...]) -> Swarm:
    rng = random.Random(f"faultlab-swarm-pair:{seed}")
    first, second, rank = pair_combination(pair, seed // (PAIR_EVERY * len(PAIRS)))
    faults = _pair_faults([first, second], rank, rng.randint(1, min(PAIR_CALLS, len(calls))))
    return Swarm(seed, ((site_name(first), 1.0), (site_name(second), 1.0)), faults, calls,
                 rng.choice(START_METHODS), "calls", pair=pair)


def pair_combination(pair: tuple[str, str], visit: int) -> tuple[dict[str, Any], dict[str, Any], int]:
    """The ``visit``-th draw of ``pair``: its sites and the first's rank, in a fixed shuffle of
    every combination (``pair_sites`` x ranks), so that each comes once in as many visits."""
    combos = [(a, b, rank) for a, b in pair_sites(pair) for rank in range(WORLD_SIZE)]
    random.Random(f"faultlab-swarm-pair-order:{pair[0]}+{pair[1]}").shuffle(combos)
    return combos[visit % len(combos)]


def _pair_faults(sites: list[dict[str, Any]], rank: int, k: int) -> tuple[Fault, ...]:
    """Both on call ``k``, the first on ``rank``, the second on the other (a rank killed
    first cannot serve the second's point)."""
    return tuple(fault_from_dict({**site, "rank": (rank + i) % WORLD_SIZE, "on_call": ["*", k]})
                 for i, site in enumerate(sites))


assert STUBBORN.method in SLEEPERS  # the model counts a stubborn worker's sleep


def _checked(drawn: Swarm) -> Swarm:
    misses = deadline_misses(drawn.calls)
    if misses:
        raise AssertionError(f"swarm seed {drawn.seed} breaks the fault-free deadline model: "
                             + "; ".join(misses))
    return drawn


def expects_timeout(call: CallSpec) -> bool:
    """A late call: its deadline is shorter than its own sleep (it asks for a TimeoutError)."""
    return call.timeout is not None and call.timeout < sleeps_s(call)


def deadline_misses(calls: tuple[CallSpec, ...] | list[CallSpec]) -> list[str]:
    """Each call the fault-free deadline model says would miss its deadline with no fault:
    one whose deadline leaves less than FAULT_FREE_MARGIN_S beyond every sleep queued before
    it and its own (late calls aside, which must be late even when served at once)."""
    out, backlog = [], 0.0
    for i, call in enumerate(calls):
        own = sleeps_s(call)
        need = backlog + own + FAULT_FREE_MARGIN_S
        if not expects_timeout(call) and (call.timeout is None or call.timeout < need):
            out.append(f"call {i} ({call.method}) has a deadline of {call.timeout} s, "
                       f"the model needs {need:.4f} s")
        backlog += own
    return out


def _fault(rng: random.Random, site: dict[str, Any], p: float, calls: tuple[CallSpec, ...]) -> Fault:
    rank = rng.randrange(WORLD_SIZE)
    if site["kind"] in TIMED:
        return fault_from_dict({**site, "rank": rank, "at": [0.0, 0.15]})
    methods = sorted({c.method for c in calls})
    watched = "*" if rng.random() < 0.5 else rng.choice(methods)  # a workload has ~7 calls
    if site.get("phase") == MID_REPLY:
        watched = "echo"  # the calls whose replies stream (draw makes them big)
    return fault_from_dict({**site, "rank": rank, "probability": p, "calls_of": watched})


def _big(call: CallSpec) -> CallSpec:
    return dataclasses.replace(call, payload_bytes=BIG_PAYLOAD)


def _calls(rng: random.Random, seed: int, n: int) -> tuple[CallSpec, ...]:
    """Every deadline is met with no fault (the fault-free model): DEADLINE_SLACK_S plus every
    sleep queued before the call, except a late sleep's, which asks for its TimeoutError."""
    calls, backlog = [], 0.0
    for i in range(n):
        call = _call(rng, seed, i, round(DEADLINE_SLACK_S + backlog, 4))
        backlog += sleeps_s(call)
        calls.append(call)
    return tuple(calls)


def _call(rng: random.Random, seed: int, i: int, timeout: float) -> CallSpec:
    method = rng.choice(METHODS)
    non_block = rng.random() < 0.4
    if method == "echo":
        big = BIG_PAYLOAD if rng.random() < BIG_ECHO_P else None
        return CallSpec("echo", (f"s{seed}-c{i}",), timeout, non_block, payload_bytes=big)
    if method == "sleep":  # unique seconds: a reply given to another sleep is seen
        seconds = round(rng.choice((0.01, 0.1, 0.3)) + i * 1e-4, 4)
        late = rng.random() < 0.3  # slower than its deadline: a TimeoutError, a late reply
        return CallSpec("sleep", (seconds,), round(seconds / 3, 4) if late else timeout, non_block)
    if method == "get_rank":
        return CallSpec("get_rank", (), timeout, non_block, rng.choice((None, 0, 1)))
    return CallSpec("fail", (f"s{seed}-f{i}",), timeout, non_block)
