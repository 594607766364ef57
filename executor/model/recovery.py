"""Recovery policies for the engine: ``FailStop`` (the default) or ``Restart``.

    a step raises ─► Recovery.recover(engine, cause)
        ├─ executor.restart(reason): a new incarnation of every worker (executor/restart.py)
        │     └─ raises (restart budget spent, shut down) ─► the engine fails as under fail_stop
        ├─ every unfinished request: retries + 1
        │     ├─ over policy.request_retries ─► lost: its Future fails naming the budget and cause
        │     └─ else replay = 0: its prompt and kept output tokens are fed again, one step per
        │        original step, so each step computes exactly what the first run computed
        └─ RecoveryRecord: when detected, restarted, first new token; requests rebuilt and
           lost; tokens recomputed

Invariants:
- A request's tokens never change once produced: a replay feeds the kept tokens; a
  re-sampled token that differs from the kept one is counted (``mismatches``), never used.
  With the model's batch-independent kernels the count stays 0 (tests check it).
- Bounded: every recovery uses one of the executor's ``restart_budget`` restarts, and every
  request at most ``request_retries`` recoveries; nothing retries forever.
- Traces (tracing on): the ``engine.recovery`` span joins the caller's trace and links to
  every unfinished request's span; ``executor.restart`` (and its start-up) are its children;
  each rebuilt request gets an ``engine.rebuild`` span in its own trace (executor/model/request_traces.py).
  ``telemetry/story.py`` links them to the fault and its detection when the run is told.
- Recovery state lives here and on ``Request.retries`` / ``Request.replay``; the engine's
  queues are its own: a rebuild goes through ``begin_rebuild``/``rebuild``/``drop``.
"""

from __future__ import annotations

import abc
import dataclasses
import logging
import math
import time
from typing import TYPE_CHECKING, Any, ClassVar

import telemetry
from executor.errors import ExecutorFailedError

if TYPE_CHECKING:
    from executor.model.engine import LLMEngine, Request

log = logging.getLogger("executor.model.recovery")


class RecoveryPolicy(abc.ABC):
    """What the engine does when a step fails.  A policy is a small frozen object: adding
    one is a subclass here and its entry in ``POLICIES`` (chaos reads ``recovers``)."""

    name: ClassVar[str]
    recovers: ClassVar[bool]  # a failed step is survived (chaos then expects a recovery)

    @abc.abstractmethod
    def recovery_for(self, executor: Any) -> Recovery | None:
        """The recovery at work for one engine over ``executor``; None: fail at once."""


@dataclasses.dataclass(frozen=True)
class FailStop(RecoveryPolicy):
    """The engine fails: every pending request raises, naming the cause."""

    name: ClassVar[str] = "fail_stop"
    recovers: ClassVar[bool] = False

    def recovery_for(self, executor: Any) -> Recovery | None:
        return None


@dataclasses.dataclass(frozen=True)
class Restart(RecoveryPolicy):
    """Restart the executor's workers and rebuild every unfinished request."""

    name: ClassVar[str] = "restart"
    recovers: ClassVar[bool] = True
    request_retries: int = 3  # recoveries one request may go through before it is lost

    def __post_init__(self) -> None:
        retries = self.request_retries
        if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
            raise ValueError(f"request_retries must be an integer >= 0, got {retries!r}")

    def recovery_for(self, executor: Any) -> Recovery | None:
        if not callable(getattr(executor, "restart", None)):
            raise TypeError(f"the restart policy needs an executor with restart(); "
                            f"{type(executor).__name__} has none")
        return Recovery(self)


POLICIES: dict[str, type[RecoveryPolicy]] = {p.name: p for p in (FailStop, Restart)}
FAIL_STOP = FailStop()
RESTART = Restart()


def policy_named(name: str) -> RecoveryPolicy:
    """The policy a command line or a suite names, with its defaults."""
    cls = POLICIES.get(name)
    if cls is None:
        raise ValueError(f"recovery policy must be one of {sorted(POLICIES)}, got {name!r}")
    return cls()


@dataclasses.dataclass
class RecoveryRecord:
    """One recovery; times are ``time.perf_counter()`` readings."""

    step: int
    cause: str
    detected_at: float
    restarted_at: float = math.nan
    first_token_at: float | None = None  # the first new (not replayed) token after it
    incarnation: int = 0
    requests_rebuilt: int = 0
    requests_lost: int = 0
    tokens_recomputed: int = 0  # output tokens produced again while rebuilding


class Recovery:
    """The ``restart`` policy at work for one engine."""

    def __init__(self, policy: Restart) -> None:
        self.policy = policy
        self.records: list[RecoveryRecord] = []
        self.mismatches = 0  # re-sampled tokens that differed from the kept ones
        self.lost: dict[str, str] = {}  # request id -> why it was lost

    @staticmethod
    def for_policy(policy: RecoveryPolicy, executor: Any) -> Recovery | None:
        if not isinstance(policy, RecoveryPolicy):
            raise TypeError(f"recovery must be a RecoveryPolicy, got {type(policy).__name__}")
        return policy.recovery_for(executor)

    @property
    def tokens_recomputed(self) -> int:
        return sum(r.tokens_recomputed for r in self.records)

    def recover(self, engine: LLMEngine, cause: Exception) -> Exception | None:
        """Restart and rebuild; return None, or the error the engine must fail with."""
        record = RecoveryRecord(engine.failed_step(), engine.describe_failure(cause),
                                time.perf_counter())
        span = _start_span(engine, record)
        executor: Any = engine.executor  # has restart(): checked by for_policy
        try:
            with telemetry.use_parent(span.context if span is not None else None):
                executor.restart(f"engine step {record.step} failed: {record.cause}")
        except Exception as exc:  # noqa: BLE001 - budget spent, shut down: fail_stop from here
            error = ExecutorFailedError(f"{record.cause}; recovery failed: {exc}")
            error.__cause__ = exc
            if span is not None:
                span.end(error)
            return error
        record.restarted_at = time.perf_counter()
        record.incarnation = int(getattr(executor, "incarnation", 0))
        self._rebuild_all(engine, cause, record, span)
        self.records.append(record)
        log.warning("recovered from %s: incarnation %d, %d requests rebuilt, %d lost",
                    record.cause, record.incarnation, record.requests_rebuilt, record.requests_lost)
        if span is not None:
            span.set_attributes({"faultlab.incarnation": record.incarnation,
                                 "faultlab.requests_rebuilt": record.requests_rebuilt,
                                 "faultlab.requests_lost": record.requests_lost,
                                 "faultlab.tokens_recomputed": record.tokens_recomputed})
            span.end()
        return None

    def _rebuild_all(self, engine: LLMEngine, cause: Exception, record: RecoveryRecord,
                     span: Any) -> None:
        for request in engine.begin_rebuild():
            request.retries += 1
            if request.retries > self.policy.request_retries:
                self._lose(engine, request, cause, record)
                continue
            engine.rebuild(request)
            if engine.traces is not None:
                engine.traces.rebuild_started(request, span)
            record.requests_rebuilt += 1
            record.tokens_recomputed += len(request.output_token_ids)

    def _lose(self, engine: LLMEngine, request: Request, cause: Exception,
              record: RecoveryRecord) -> None:
        from executor.model.engine import RequestFailedError

        why = (f"request {request.request_id!r} lost: its retry budget of "
               f"{self.policy.request_retries} recoveries is spent; last failure: {record.cause}")
        self.lost[request.request_id] = why
        record.requests_lost += 1
        error = RequestFailedError(why)
        error.__cause__ = cause
        engine.drop(request, error)

    def replayed(self, request: Request, token: int) -> None:
        """A rebuild step's token: check it against the kept one, then move on."""
        k = request.replay
        assert k is not None
        if token != request.output_token_ids[k]:
            self.mismatches += 1
            log.error("request %r: rebuilt token %d is %d, the first run had %d",
                      request.request_id, k, token, request.output_token_ids[k])
        request.replay = k + 1 if k + 1 < len(request.output_token_ids) else None

    def new_token(self) -> None:
        """A new token was generated: the first after a recovery ends its timeline."""
        if self.records and self.records[-1].first_token_at is None:
            self.records[-1].first_token_at = time.perf_counter()


def _start_span(engine: LLMEngine, record: RecoveryRecord) -> Any:
    """The ``engine.recovery`` span (None when tracing is off), linked to the requests."""
    rec = telemetry.get_recorder()
    if not rec.enabled:
        return None
    span = rec.start_span("engine.recovery", telemetry.caller_parent(), {
        "faultlab.step": record.step, "faultlab.cause": record.cause})
    if engine.traces is not None:
        engine.traces.recovery_started(span, engine.unfinished_requests)
    return span
