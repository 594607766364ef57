"""Fault kinds: small frozen dataclasses that say what to break, where, and when.

    Fault(rank, trigger, phase) ──FaultPlan.resolve(seed)──► ResolvedFault (concrete times, call numbers)
                                                              │
          phase "signal": the chaos side sends a signal ◄─────┤  (no code in the worker)
          phase "<worker point>": a failpoint in the worker ◄─┘  (executor.failpoints)

A trigger is exactly one of ``at`` (seconds after the workload starts; a number or a
``[low, high]`` range drawn from the seed), ``on_call=(method, k)`` (the k-th call of
``method``, "*" for any), or ``probability`` (each call of ``calls_of`` independently,
drawn from the seed).  Every call is broadcast, so "on a rank" means the fault hits
``rank`` while it serves that call.
"""

from __future__ import annotations

import dataclasses
import signal
from typing import Any, ClassVar

from executor import failpoints

SIGNAL = "signal"
WORKER_PHASES = tuple(p.removeprefix("worker.") for p in failpoints.WORKER_CALL_POINTS)
# kill_worker / term_worker inside a reply that streams in several chunks, once one of them
# is visible to the driver and the next is half written (chaos.points: queue.mid_chunk_write).
MID_REPLY = "mid_reply"
CORRUPT_MODES = ("flip_payload", "truncate", "clobber_seq", "clobber_flags",
                 "clear_written", "all_ff",
                 "overwrite_unread", "drop")
QUEUES = ("rpc", "reply")
NODE_MODES = ("kill", "cut_link")


_DECLARED: list[type[Fault]] = []  # the kinds of this module, filled as they are declared


class PlanError(ValueError):
    """A fault or plan is malformed; the message names the field."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Fault:
    """Base of every fault kind: which rank, and one trigger."""

    kind: ClassVar[str] = "fault"
    phases: ClassVar[tuple[str, ...]] = (SIGNAL,)
    # What the kind means, in one place: the injector, the trace, the Hypothesis strategies,
    # the oracles and the outcome table derive their sets from these (never a list of names).
    signal: ClassVar[int | None] = None  # delivered as this signal at phase "signal"
    target: ClassVar[str] = "worker"  # whose process it hits: worker | driver | node | queue | around
    stops_readers: ClassVar[bool] = False  # may leave a queue without its reader for good
    fatal: ClassVar[bool] = False  # may end the executor (or its driver)
    expected: ClassVar[str] = "recover"  # chaos.outcomes.Outcome when it hits (outcome_for)

    rank: int = 0
    at: float | tuple[float, float] | None = None
    on_call: tuple[str, int] | None = None
    probability: float | None = None
    calls_of: str = "*"  # the method whose calls ``probability`` draws over
    phase: str = SIGNAL

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A kind is registered by being declared in this module: adding one is its class
        (with its meaning, above) and a row of chaos.outcomes.TABLE."""
        super().__init_subclass__(**kwargs)
        if cls.__module__ == __name__:
            _DECLARED.append(cls)

    def __post_init__(self) -> None:
        if isinstance(self.on_call, list):
            object.__setattr__(self, "on_call", tuple(self.on_call))
        if isinstance(self.at, list):
            object.__setattr__(self, "at", tuple(self.at))
        self._check_trigger()
        if self.phase not in self.phases:
            raise PlanError(f"{self.kind}: phase must be one of {self.phases}, got {self.phase!r}")
        if not isinstance(self.rank, int) or self.rank < 0:
            raise PlanError(f"{self.kind}: rank must be a non-negative integer, got {self.rank!r}")

    def _check_trigger(self) -> None:
        given = [n for n in ("at", "on_call", "probability") if getattr(self, n) is not None]
        if len(given) > 1:
            raise PlanError(f"{self.kind}: give one trigger, not {given}")
        if not given:
            object.__setattr__(self, "at", 0.0)
        _check_at(self.kind, self.at)
        if self.on_call is not None:
            call = self.on_call
            if not (len(call) == 2 and isinstance(call[0], str) and isinstance(call[1], int)
                    and not isinstance(call[1], bool) and call[1] >= 1):
                raise PlanError(f"{self.kind}: on_call must be (method, k >= 1), got {self.on_call!r}")
        if self.probability is not None and not 0.0 <= self.probability <= 1.0:
            raise PlanError(f"{self.kind}: probability must be in [0, 1], got {self.probability!r}")

    @property
    def external(self) -> bool:
        """Injected by the chaos side (signals, helper processes), not inside a worker."""
        return self.phase == SIGNAL

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"kind": self.kind}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value != field.default:
                data[field.name] = list(value) if isinstance(value, tuple) else value
        return data


def _check_at(kind: str, at: Any) -> None:
    if at is None:
        return
    values = at if isinstance(at, tuple) else (at,)
    if len(values) not in (1, 2) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in values):
        raise PlanError(f"{kind}: at must be seconds >= 0 or a [low, high] range, got {at!r}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class KillWorker(Fault):
    """SIGKILL a worker: from outside, or by itself at a protocol phase."""

    kind: ClassVar[str] = "kill_worker"
    signal: ClassVar[int | None] = signal.SIGKILL
    stops_readers: ClassVar[bool] = True
    fatal: ClassVar[bool] = True
    expected: ClassVar[str] = "fail_fast"
    phases: ClassVar[tuple[str, ...]] = (SIGNAL, *WORKER_PHASES, MID_REPLY)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TermWorker(Fault):
    """SIGTERM a worker: it raises SystemExit once and exits with 143."""

    kind: ClassVar[str] = "term_worker"
    signal: ClassVar[int | None] = signal.SIGTERM
    stops_readers: ClassVar[bool] = True
    fatal: ClassVar[bool] = True
    expected: ClassVar[str] = "fail_fast"
    phases: ClassVar[tuple[str, ...]] = (SIGNAL, *WORKER_PHASES, MID_REPLY)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ExitWorker(Fault):
    """A worker ends itself with ``os._exit(0)`` at a phase: a clean exit code while it
    serves, no signal, no cause reported.  Still a death: the call fails at once, naming
    the rank and exit code 0 (a monitor that reads only non-zero codes as deaths misses it)."""

    kind: ClassVar[str] = "exit_worker"
    stops_readers: ClassVar[bool] = True
    fatal: ClassVar[bool] = True
    expected: ClassVar[str] = "fail_fast"
    phases: ClassVar[tuple[str, ...]] = (*WORKER_PHASES, MID_REPLY)
    phase: str = "before_execute"


@dataclasses.dataclass(frozen=True, kw_only=True)
class HangWorker(Fault):
    """SIGSTOP a worker (phase "signal"), or block inside it at a phase; for ``duration`` s
    (then SIGCONT / unblock), or until the executor ends it when ``duration`` is None."""

    kind: ClassVar[str] = "hang_worker"
    signal: ClassVar[int | None] = signal.SIGSTOP
    stops_readers: ClassVar[bool] = True
    expected: ClassVar[str] = "deadline"
    phases: ClassVar[tuple[str, ...]] = (SIGNAL, *WORKER_PHASES)
    duration: float | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class ResumeWorker(Fault):
    """SIGCONT a worker (undoes a SIGSTOP hang)."""

    kind: ClassVar[str] = "resume_worker"
    signal: ClassVar[int | None] = signal.SIGCONT


@dataclasses.dataclass(frozen=True, kw_only=True)
class SlowWorker(Fault):
    """Delay a worker by ``delay`` seconds at a phase, on each triggering call."""

    kind: ClassVar[str] = "slow_worker"
    stops_readers: ClassVar[bool] = True
    phases: ClassVar[tuple[str, ...]] = WORKER_PHASES
    phase: str = "before_execute"
    delay: float = 0.1


@dataclasses.dataclass(frozen=True, kw_only=True)
class RaiseInWorker(Fault):
    """Make a worker raise at a phase (inside the method's try: a WorkerError reply)."""

    kind: ClassVar[str] = "raise_in_worker"
    fatal: ClassVar[bool] = True  # at a phase outside the try (outcome_for)
    expected: ClassVar[str] = "fail_fast"
    phases: ClassVar[tuple[str, ...]] = WORKER_PHASES
    phase: str = "before_execute"
    message: str = "chaos: injected error"


@dataclasses.dataclass(frozen=True, kw_only=True)
class CorruptQueue(Fault):
    """Damage a chunk just before it becomes visible.

    ``queue="rpc"`` damages the driver's request ring (seen by every worker);
    ``queue="reply"`` damages rank ``rank``'s reply ring (seen by the driver).
    Modes: flip_payload / truncate (a checksum catches it: that message fails, the queue
    recovers), clobber_seq / clobber_flags / overwrite_unread (metadata damage: fatal),
    drop (a consistent ABORT: the message silently vanishes; the call hits its deadline);
    clear_written / all_ff hit a chunk just after it was published (its written flag cleared,
    or every metadata byte set to 0xFF): fatal, detected against the published seq, which
    also claims the next message, so readers that took the chunk before the damage landed
    see it too, or, if none looks before the next message, the writer does then.
    """

    kind: ClassVar[str] = "corrupt_queue"
    target: ClassVar[str] = "queue"
    stops_readers: ClassVar[bool] = True
    fatal: ClassVar[bool] = True
    expected: ClassVar[str] = "fail_fast"  # by mode (outcome_for)
    phases: ClassVar[tuple[str, ...]] = ("before_publish",)
    phase: str = "before_publish"
    queue: str = "rpc"
    mode: str = "flip_payload"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.queue not in QUEUES:
            raise PlanError(f"{self.kind}: queue must be one of {QUEUES}, got {self.queue!r}")
        if self.mode not in CORRUPT_MODES:
            raise PlanError(f"{self.kind}: mode must be one of {CORRUPT_MODES}, got {self.mode!r}")

    @property
    def external(self) -> bool:
        return False


@dataclasses.dataclass(frozen=True, kw_only=True)
class KillDriver(Fault):
    """SIGKILL the driver (run in a subprocess); every worker must see it and exit."""

    kind: ClassVar[str] = "kill_driver"
    signal: ClassVar[int | None] = signal.SIGKILL
    target: ClassVar[str] = "driver"
    fatal: ClassVar[bool] = True
    expected: ClassVar[str] = "exit_clean"


@dataclasses.dataclass(frozen=True, kw_only=True)
class KillNode(Fault):
    """Take remote node ``node`` away at once: its ``faultlab worker`` agent and every worker.

    ``mode="kill"`` SIGKILLs the whole process tree (the TCP connections close);
    ``mode="cut_link"`` SIGSTOPs it, so the link goes silent with its connections still open
    (only the heartbeat timeout can tell), and resumes it when the scenario ends.  Needs an
    executor with ``nnodes > 1``; ``rank`` is unused.
    """

    kind: ClassVar[str] = "kill_node"
    target: ClassVar[str] = "node"
    stops_readers: ClassVar[bool] = True
    fatal: ClassVar[bool] = True
    expected: ClassVar[str] = "fail_fast"
    node: int = 1
    mode: str = "kill"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.node, int) or isinstance(self.node, bool) or self.node < 1:
            raise PlanError(f"{self.kind}: node must be a remote node, 1 or more, got {self.node!r}")
        if self.mode not in NODE_MODES:
            raise PlanError(f"{self.kind}: mode must be one of {NODE_MODES}, got {self.mode!r}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class StarveCPU(Fault):
    """Run ``processes`` busy loops for ``duration`` seconds (bounded)."""

    kind: ClassVar[str] = "starve_cpu"
    target: ClassVar[str] = "around"
    duration: float = 1.0
    processes: int = 2


@dataclasses.dataclass(frozen=True, kw_only=True)
class StarveMemory(Fault):
    """Hold ``megabytes`` of touched memory in a helper process for ``duration`` seconds."""

    kind: ClassVar[str] = "starve_memory"
    target: ClassVar[str] = "around"
    duration: float = 1.0
    megabytes: int = 256


INTERRUPT_PHASES = ("mid_request", "mid_reply", "before_unpickle_reply", "before_publish",
                    "after_written")
FORK_MODES = ("exit", "linger", "call")


@dataclasses.dataclass(frozen=True, kw_only=True)
class InterruptDriver(Fault):
    """SIGINT to the driver alone (what Ctrl-C or Jupyter's interrupt button sends).

    Phase "signal": from a chaos thread at ``at`` (or just after the triggering call is
    enqueued); "mid_request": inside the driver, mid-stream of a multi-chunk request;
    "mid_reply": sent by rank ``rank`` mid-stream of its multi-chunk reply;
    "before_unpickle_reply": in the driver, a reply in hand, before it is unpickled;
    "before_publish": inside the request's publish, the chunk complete but not yet visible;
    "after_written": inside it once the chunk is visible (its written flag set, the published
    counter not yet moved), after a pause in which the workers take it
    (chaos.publish_interrupts: a publish cut either side of going visible).
    The caller must see KeyboardInterrupt and the executor must stay usable and in step.
    Needs ``run_scenario`` on the main thread (only it receives SIGINT).
    """

    kind: ClassVar[str] = "interrupt_driver"
    signal: ClassVar[int | None] = signal.SIGINT
    target: ClassVar[str] = "driver"
    expected: ClassVar[str] = "interrupt"
    phases: ClassVar[tuple[str, ...]] = (SIGNAL, *INTERRUPT_PHASES)

    @property
    def external(self) -> bool:
        return self.phase == SIGNAL


@dataclasses.dataclass(frozen=True, kw_only=True)
class ForkInDriver(Fault):
    """A plain ``os.fork()`` child of the driver: it exits at once (``mode="exit"``), lingers
    ``duration`` s first (``"linger"``), or calls the inherited executor (``"call"``), and
    then exits the way the interpreter does (atexit handlers, where finalizers run).
    The parent's executor must not notice; the child's call must raise a clear error."""

    kind: ClassVar[str] = "fork_in_driver"
    target: ClassVar[str] = "around"  # a child of the driver; the driver is no victim
    mode: str = "exit"
    duration: float = 0.5

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.mode not in FORK_MODES:
            raise PlanError(f"{self.kind}: mode must be one of {FORK_MODES}, got {self.mode!r}")
        if not isinstance(self.duration, (int, float)) or not 0 <= self.duration <= 30:
            raise PlanError(f"{self.kind}: duration must be 0..30 s, got {self.duration!r}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ForkInWorker(Fault):
    """Inside a worker, at a phase: fork a grandchild that lingers ``duration`` s (holding
    every inherited descriptor), then SIGKILL the worker.  The death must be detected
    within the detection bound, not when the grandchild exits."""

    kind: ClassVar[str] = "fork_in_worker"
    stops_readers: ClassVar[bool] = True
    fatal: ClassVar[bool] = True
    expected: ClassVar[str] = "fail_fast"
    phases: ClassVar[tuple[str, ...]] = WORKER_PHASES
    phase: str = "before_execute"
    duration: float = 10.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.duration, (int, float)) or not 0 <= self.duration <= 60:
            raise PlanError(f"{self.kind}: duration must be 0..60 s, got {self.duration!r}")


REAPER_MODES = ("ignore", "reap")


@dataclasses.dataclass(frozen=True, kw_only=True)
class OutsideReaper(Fault):
    """Someone else reaps the driver's children, from when it fires until the scenario has
    shut the executor down (shutdown runs under it): ``mode="ignore"`` sets SIGCHLD to
    SIG_IGN (the kernel reaps every exited child at once), ``"reap"`` collects every exited
    child with ``waitpid(-1, WNOHANG)``, as a server's SIGCHLD handler does.  Nothing may
    change for calls; a worker death is still named (rank, pid); shutdown stays fast, sends
    no signal to a freed pid and leaves no descriptor (chaos.surroundings.ChildReaper)."""

    kind: ClassVar[str] = "outside_reaper"
    target: ClassVar[str] = "driver"
    mode: str = "ignore"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.mode not in REAPER_MODES:
            raise PlanError(f"{self.kind}: mode must be one of {REAPER_MODES}, got {self.mode!r}")


KINDS: dict[str, type[Fault]] = {cls.kind: cls for cls in _DECLARED}  # every kind, in declaration order


def fault_class(kind: str) -> type[Fault]:
    """The class of fault kind ``kind``; an unknown kind is a ``PlanError``, never a no-op."""
    try:
        return KINDS[kind]
    except KeyError:
        raise PlanError(f"unknown fault kind {kind!r}; known: {sorted(KINDS)}") from None


def kinds_where(**wanted: object) -> tuple[str, ...]:
    """The kinds whose metadata matches, in declaration order, e.g. ``kinds_where(fatal=True)``."""
    return tuple(k for k, cls in KINDS.items()
                 if all(getattr(cls, name) == value for name, value in wanted.items()))


def signal_name(kind: str) -> str | None:
    """"SIGKILL" etc. for a kind delivered by a signal, else None."""
    sig = fault_class(kind).signal
    return None if sig is None else signal.Signals(sig).name


def fault_from_dict(data: dict[str, Any], where: str = "fault") -> Fault:
    """Build a fault from its TOML/JSON form; errors name ``where`` and the bad key."""
    data = dict(data)
    kind = data.pop("kind", None)
    if kind not in KINDS:
        raise PlanError(f"{where}.kind: must be one of {sorted(KINDS)}, got {kind!r}")
    cls = KINDS[kind]
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise PlanError(f"{where}.{unknown[0]}: unknown key for {kind}; known: {sorted(known)}")
    try:
        return cls(**data)
    except PlanError as exc:
        raise PlanError(f"{where}: {exc}") from None
    except TypeError as exc:
        raise PlanError(f"{where}: {exc}") from None
