"""Hypothesis strategies for fault plans and call sequences (a base for property tests).

Every random choice of chaos comes from ``plan_random(seed, index)``; under Hypothesis the
seed itself is drawn (``seeds``), so a failing example shrinks to a small seed and plan and
replays exactly.  ``SHARED_RANDOM`` is registered with Hypothesis so that any code that
uses it is reset and reproduced between examples.
"""

from __future__ import annotations

import dataclasses
import random
import signal
from collections.abc import Sequence
from typing import Any

from hypothesis import register_random
from hypothesis import strategies as st

from chaos.faults import (
    WORKER_PHASES,
    CorruptQueue,
    Fault,
    HangWorker,
    KillWorker,
    RaiseInWorker,
    SlowWorker,
    TermWorker,
    fault_class,
    kinds_where,
)
from chaos.plan import FaultPlan
from chaos.workloads import CallSpec

SHARED_RANDOM = random.Random(0)
register_random(SHARED_RANDOM)

seeds = st.integers(min_value=0, max_value=2**32 - 1)
methods = st.sampled_from(["echo", "sleep", "get_rank"])


def call_specs(world_size: int = 2) -> st.SearchStrategy[CallSpec]:
    return st.builds(
        lambda method, arg, timeout, non_block, rank: CallSpec(
            method, (arg,) if method != "get_rank" else (), timeout, non_block, rank),
        methods, st.sampled_from([0.0, 0.01, 0.05]),
        st.one_of(st.none(), st.sampled_from([0.5, 1.0, 2.0])), st.booleans(),
        st.one_of(st.none(), st.integers(0, world_size - 1)))


def triggers() -> st.SearchStrategy[dict[str, object]]:
    return st.one_of(
        st.builds(lambda m, k: {"on_call": (m, k)}, methods, st.integers(1, 5)),
        st.builds(lambda p: {"probability": p}, st.sampled_from([0.1, 0.5, 1.0])),
        st.builds(lambda t: {"at": t}, st.floats(0.0, 0.5)))


def faults(world_size: int = 2) -> st.SearchStrategy[object]:
    ranks = st.integers(0, world_size - 1)
    phases = st.sampled_from(["signal", *WORKER_PHASES])
    return st.one_of(
        st.builds(lambda r, t, p: KillWorker(rank=r, phase=p, **t), ranks, triggers(), phases),
        st.builds(lambda r, t, p: TermWorker(rank=r, phase=p, **t), ranks, triggers(), phases),
        st.builds(lambda r, t: HangWorker(rank=r, duration=0.5, **t), ranks, triggers()),
        st.builds(lambda r, t: SlowWorker(rank=r, delay=0.01, **t), ranks, triggers()),
        st.builds(lambda r, t: RaiseInWorker(rank=r, **t), ranks, triggers()),
        st.builds(lambda r, t, m, q: CorruptQueue(rank=r, mode=m, queue=q, **t), ranks,
                  triggers(), st.sampled_from(["flip_payload", "truncate", "clobber_seq", "drop"]),
                  st.sampled_from(["rpc", "reply"])))


def fault_plans(world_size: int = 2, max_faults: int = 3) -> st.SearchStrategy[FaultPlan]:
    return st.builds(lambda fs, seed: FaultPlan(fs, seed=seed),
                     st.lists(faults(world_size), max_size=max_faults), seeds)


# ---------------------------------------------------------------- calls and faults for property tests
#
# The executor state machine (``chaos.machine``) and tests/property draw calls as ``CallSpec``
# shapes: what runs, for how long, with which deadline, blocking or not, and which rank
# replies.  ``unique_args`` then gives each call a payload no other call has, so a reply
# attributed to the wrong call is always visible.

RPC_METHODS = ("echo", "sleep", "fail", "get_rank")
TIMEOUTS: tuple[float | None, ...] = (None, 0.05, 0.25, 1.0)
SLEEPS = (0.0, 0.01, 0.05, 0.3)
# Kinds a signal delivers to a worker, from outside, that stop it (not SIGCONT: it undoes).
SIGNAL_KINDS = tuple(k for k in kinds_where(target="worker")
                     if fault_class(k).signal not in (None, signal.SIGCONT))


def rpc_calls(
    world_size: int = 2, *, methods: Sequence[str] = RPC_METHODS,
    timeouts: Sequence[float | None] = TIMEOUTS, sleeps: Sequence[float] = SLEEPS,
    non_block: bool | None = None,
) -> st.SearchStrategy[CallSpec]:
    """One EchoWorker call: ``sleep`` carries its duration, the others a placeholder.
    ``non_block`` None draws blocking or not; True/False fixes it."""
    return st.builds(
        call_spec, st.sampled_from(list(methods)), st.sampled_from(list(sleeps)),
        st.sampled_from(list(timeouts)), st.booleans() if non_block is None else st.just(non_block),
        st.one_of(st.none(), st.integers(0, world_size - 1)))


def call_spec(method: str, seconds: float, timeout: float | None, non_block: bool,
               reply_rank: int | None) -> CallSpec:
    args: tuple[object, ...] = {"sleep": (seconds,), "get_rank": ()}.get(method, ("",))
    return CallSpec(method, args, timeout, non_block, reply_rank)


def call_sequences(world_size: int = 2, max_calls: int = 6) -> st.SearchStrategy[list[CallSpec]]:
    return st.lists(rpc_calls(world_size), min_size=1, max_size=max_calls)


def unique_args(spec: CallSpec, index: int) -> tuple[object, ...]:
    """Arguments that make call ``index``'s right result differ from every other call's."""
    if spec.method == "sleep":
        return (float(spec.args[0]) + index * 1e-6,)  # sleep returns its argument
    if spec.method in ("echo", "fail"):
        return (f"call-{index}",)
    return spec.args


def signal_faults(world_size: int = 2, max_k: int = 4) -> st.SearchStrategy[Fault]:
    """A fault sent from outside (no code in the worker), on the k-th call of any method."""
    def build(kind: str, rank: int, k: int, duration: float) -> Fault:
        cls = fault_class(kind)
        fields = {f.name for f in dataclasses.fields(cls)}
        extra: dict[str, Any] = {"duration": duration} if "duration" in fields else {}
        return cls(rank=rank, on_call=("*", k), **extra)

    return st.builds(build, st.sampled_from(SIGNAL_KINDS), st.integers(0, world_size - 1),
                     st.integers(1, max_k), st.sampled_from([0.05, 0.3]))


def signal_fault_plans(world_size: int = 2, max_faults: int = 2) -> st.SearchStrategy[FaultPlan]:
    return st.builds(lambda fs, seed: FaultPlan(fs, seed=seed),
                     st.lists(signal_faults(world_size), max_size=max_faults), seeds)
