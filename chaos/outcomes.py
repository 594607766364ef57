"""The expected-outcome table: for each fault kind and phase, what the executor must do.

In the style of loky's crash-case table: a row is (fault, where it hits, expected outcome).
``outcome_for`` answers for any fault; ``TABLE`` lists one representative row per case,
which ``tests/chaos_tests/test_outcome_table.py`` runs on fork, forkserver and spawn.

    FAIL_FAST      the executor detects the failure within its bound, fails every call in
                   flight and later ones with ExecutorFailedError, runs the callback once
    DEADLINE       the hit call raises TimeoutError at its deadline; the executor stays up
    ERROR_RECOVER  the hit call raises a documented error (WorkerError / CorruptMessageError);
                   the executor stays up and later calls succeed
    INTERRUPT      the hit call raises KeyboardInterrupt (Ctrl-C); the executor stays up and
                   in step, later calls succeed
    RECOVER        every call succeeds (maybe slower)
    EXIT_CLEAN     the driver died: every worker exits, nothing is left in /dev/shm
    FAULT_FREE     no fault fired: every call ends as its request asks (its own result, or
                   the error it asks for: ``fail``, a ``sleep`` past its timeout, a declared
                   one) and the executor never fails (``chaos.oracles.fault_free_stays_fault_free``)

A ``KillNode`` row runs with a second node on loopback (``config_for``: ``TWO_NODES``).
"""

from __future__ import annotations

import enum

from chaos.faults import (
    CorruptQueue,
    ExitWorker,
    Fault,
    ForkInDriver,
    ForkInWorker,
    HangWorker,
    InterruptDriver,
    KillDriver,
    KillNode,
    KillWorker,
    OutsideReaper,
    RaiseInWorker,
    ResumeWorker,
    SlowWorker,
    StarveCPU,
    StarveMemory,
    TermWorker,
)


class Outcome(enum.StrEnum):
    FAIL_FAST = "fail_fast"
    DEADLINE = "deadline"
    ERROR_RECOVER = "error_recover"
    INTERRUPT = "interrupt"
    RECOVER = "recover"
    EXIT_CLEAN = "exit_clean"
    FAULT_FREE = "fault_free"  # what "auto" expects of a run in which no fault fired


# Phases whose exceptions the worker turns into an error reply; elsewhere an exception
# escapes the serve loop and ends the process (which the driver must detect).
_CAUGHT_PHASES = ("before_unpickle", "before_execute", "after_execute", "before_pickle_reply")
_FATAL_DAMAGE = ("clobber_seq", "clobber_flags", "overwrite_unread", "clear_written", "all_ff")
# A KillNode row needs a second node; liveness fast enough that a cut link is seen in ~1 s.
TWO_NODES = {"nnodes": 2, "heartbeat_interval": 0.1, "node_timeout": 1.0}


# Chunks so small that every request and reply streams in several: "mid-stream" exists.
TINY_CHUNKS = {"chunk_bytes": 64}


def config_for(fault: Fault) -> dict[str, object]:
    """ExecutorConfig fields a table row needs beyond the defaults."""
    if isinstance(fault, InterruptDriver) and fault.phase in ("mid_request", "mid_reply"):
        return dict(TINY_CHUNKS)
    return dict(TWO_NODES) if isinstance(fault, KillNode) else {}


def outcome_for(fault: Fault) -> Outcome:
    """What the executor must do when ``fault`` hits (assuming the hit call has a deadline)."""
    if isinstance(fault, RaiseInWorker):
        return Outcome.ERROR_RECOVER if fault.phase in _CAUGHT_PHASES else Outcome.FAIL_FAST
    if isinstance(fault, CorruptQueue):
        if fault.mode in _FATAL_DAMAGE:
            return Outcome.FAIL_FAST
        return Outcome.DEADLINE if fault.mode == "drop" else Outcome.ERROR_RECOVER
    return Outcome(type(fault).expected)  # the kind's own word (chaos.faults)


def combined_outcome(faults: list[Fault]) -> Outcome | None:
    """The strongest outcome of several faults (a death dominates everything else)."""
    order = list(Outcome)
    outcomes = [outcome_for(f) for f in faults]
    return min(outcomes, key=lambda o: (o != Outcome.EXIT_CLEAN, order.index(o))) if outcomes else None


HIT = ("sleep", 1)  # the call the table's faults hit: the first call of "sleep"

TABLE: list[tuple[str, Fault, Outcome]] = [
    ("kill, external, mid-call", KillWorker(rank=1, on_call=HIT), Outcome.FAIL_FAST),
    ("kill, before execute", KillWorker(rank=0, on_call=HIT, phase="before_execute"), Outcome.FAIL_FAST),
    ("kill, before reply", KillWorker(rank=1, on_call=HIT, phase="before_reply"), Outcome.FAIL_FAST),
    ("kill, after dequeue", KillWorker(rank=1, on_call=HIT, phase="after_dequeue"), Outcome.FAIL_FAST),
    ("kill while idle", KillWorker(rank=0, at=0.05), Outcome.FAIL_FAST),
    ("sigterm, external", TermWorker(rank=1, on_call=HIT), Outcome.FAIL_FAST),
    ("sigterm, before execute", TermWorker(rank=0, on_call=HIT, phase="before_execute"), Outcome.FAIL_FAST),
    ("exit 0 before execute", ExitWorker(rank=1, on_call=HIT), Outcome.FAIL_FAST),
    ("exit 0 after reply", ExitWorker(rank=0, on_call=HIT, phase="after_reply"), Outcome.FAIL_FAST),
    ("sigstop, external", HangWorker(rank=1, on_call=HIT), Outcome.DEADLINE),
    ("sigstop then sigcont", HangWorker(rank=1, on_call=HIT, duration=1.5), Outcome.DEADLINE),
    ("block before execute", HangWorker(rank=0, on_call=HIT, phase="before_execute", duration=1.5), Outcome.DEADLINE),
    ("block before reply", HangWorker(rank=1, on_call=HIT, phase="before_reply", duration=1.5), Outcome.DEADLINE),
    ("sigcont a running worker", ResumeWorker(rank=1, on_call=HIT), Outcome.RECOVER),
    ("slow every call", SlowWorker(rank=1, probability=1.0, delay=0.02), Outcome.RECOVER),
    ("raise before execute", RaiseInWorker(rank=1, on_call=HIT), Outcome.ERROR_RECOVER),
    ("raise before unpickle", RaiseInWorker(rank=0, on_call=HIT, phase="before_unpickle"), Outcome.ERROR_RECOVER),
    ("raise before pickling reply", RaiseInWorker(rank=1, on_call=HIT, phase="before_pickle_reply"), Outcome.ERROR_RECOVER),
    ("raise after dequeue", RaiseInWorker(rank=1, on_call=HIT, phase="after_dequeue"), Outcome.FAIL_FAST),
    ("raise before reply", RaiseInWorker(rank=0, on_call=HIT, phase="before_reply"), Outcome.FAIL_FAST),
    ("flip rpc payload", CorruptQueue(on_call=HIT, queue="rpc", mode="flip_payload"), Outcome.ERROR_RECOVER),
    ("flip reply payload", CorruptQueue(rank=1, on_call=HIT, queue="reply", mode="flip_payload"), Outcome.ERROR_RECOVER),
    ("truncate rpc payload", CorruptQueue(on_call=HIT, queue="rpc", mode="truncate"), Outcome.ERROR_RECOVER),
    ("clobber rpc seq", CorruptQueue(on_call=HIT, queue="rpc", mode="clobber_seq"), Outcome.FAIL_FAST),
    ("clobber reply flags", CorruptQueue(rank=0, on_call=HIT, queue="reply", mode="clobber_flags"), Outcome.FAIL_FAST),
    ("overwrite unread reply", CorruptQueue(rank=1, on_call=HIT, queue="reply", mode="overwrite_unread"), Outcome.FAIL_FAST),
    ("clear a published rpc written flag", CorruptQueue(on_call=HIT, queue="rpc", mode="clear_written"), Outcome.FAIL_FAST),
    ("drop an rpc message", CorruptQueue(on_call=HIT, queue="rpc", mode="drop"), Outcome.DEADLINE),
    ("drop a reply", CorruptQueue(rank=1, on_call=HIT, queue="reply", mode="drop"), Outcome.DEADLINE),
    ("starve cpu", StarveCPU(at=0.0, duration=0.6, processes=2), Outcome.RECOVER),
    ("starve memory", StarveMemory(at=0.0, duration=0.6, megabytes=128), Outcome.RECOVER),
    ("kill the driver mid-call", KillDriver(on_call=HIT), Outcome.EXIT_CLEAN),
    ("kill node 1 mid-call", KillNode(node=1, on_call=HIT), Outcome.FAIL_FAST),
    ("cut node 1's link mid-call", KillNode(node=1, on_call=HIT, mode="cut_link"), Outcome.FAIL_FAST),
    ("ctrl-c just after a call is sent", InterruptDriver(on_call=HIT), Outcome.INTERRUPT),
    ("ctrl-c mid-request", InterruptDriver(on_call=HIT, phase="mid_request"), Outcome.INTERRUPT),
    ("ctrl-c before unpickling a reply", InterruptDriver(on_call=HIT, phase="before_unpickle_reply"),
     Outcome.INTERRUPT),
    ("ctrl-c before a request is visible", InterruptDriver(on_call=HIT, phase="before_publish"),
     Outcome.INTERRUPT),
    ("ctrl-c once a request is visible", InterruptDriver(on_call=HIT, phase="after_written"),
     Outcome.INTERRUPT),
    ("fork a child that exits", ForkInDriver(on_call=HIT), Outcome.RECOVER),
    ("fork a child that lingers", ForkInDriver(on_call=HIT, mode="linger", duration=0.3), Outcome.RECOVER),
    ("fork a child that calls the executor", ForkInDriver(on_call=HIT, mode="call"), Outcome.RECOVER),
    ("fork a lingering grandchild, then die", ForkInWorker(rank=1, on_call=HIT), Outcome.FAIL_FAST),
    ("SIGCHLD ignored in the driver", OutsideReaper(on_call=HIT), Outcome.RECOVER),
    ("an outside handler reaps the driver's children", OutsideReaper(on_call=HIT, mode="reap"),
     Outcome.RECOVER),
]
