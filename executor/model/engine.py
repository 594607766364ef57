"""The engine loop: requests in, batches through the executor, generated tokens out.

    add_request ─► waiting ─┐
                            ▼  each step: runnable requests (not in flight) ─► ModelBatch
    LLMEngine.step ─► collective_rpc("execute_model", batch, unique_reply_rank=output_rank)
                            │        (non-blocking, up to max_concurrent_batches in flight)
                            ▼
                 oldest in-flight reply ─► ModelOutput ─► append one token per request
                            │
                            └─► request done ─► its Future gets the tokens; its KV cache is
                                freed by the next batch (finished_request_ids)

A request has at most one batch in flight (the next token needs the last one), so with
several batches in flight the runnable requests are split evenly between them.

Failure: any error from a step (``ExecutorFailedError``, ``WorkerError``, ``TimeoutError``,
...) leaves the ranks' KV caches out of step with each other, so it is fatal: every pending
request's Future fails with ``RequestFailedError`` naming the cause (rank, pid, signal), the
engine refuses further work, and ``run`` raises ``EngineFailedError``.  Nothing waits longer
than the step timeout (plus slack) for a reply.  That is the ``fail_stop`` policy, the
default; under ``restart`` (executor/model/recovery.py) a failed step restarts the workers and
rebuilds every unfinished request's KV cache from its prompt and tokens so far instead, and
a request fails only when its own retry budget is spent.

Tracing (when telemetry is on; executor/model/request_traces.py): one SERVER span per request with gen_ai.*
attributes, in the caller's trace if it has one; each step's RPC is the child of an
``engine.step`` span linked to the requests it served.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any, Protocol

from executor.errors import ExecutorFailedError
from executor.model.batch import ModelBatch, ModelOutput
from executor.model.recovery import FAIL_STOP, Recovery, RecoveryPolicy
from executor.model.request_traces import RequestTraces

# A future that the executor should have ended by its own deadline gets this much longer
# before the engine stops waiting on its own (guards against a wedged executor).
RESULT_SLACK_S = 5.0
# A WorkerError from a rank whose peer just died (gloo: "connection closed") may overtake
# the executor's death detection; wait this long for it, so the error names the dead rank.
DEATH_GRACE_S = 1.0


class ExecutorLike(Protocol):
    """What the engine needs from ``executor.MultiprocExecutor``."""

    @property
    def output_rank(self) -> int: ...

    @property
    def max_concurrent_batches(self) -> int: ...

    @property
    def is_failed(self) -> bool: ...

    @property
    def worker_pids(self) -> list[int]: ...

    def check_health(self) -> None: ...

    def collective_rpc(self, method: Any, timeout: float | None = None, args: tuple[Any, ...] = (),
                       kwargs: dict[str, Any] | None = None, non_block: bool = False,
                       unique_reply_rank: int | None = None) -> Any: ...


class EngineFailedError(RuntimeError):
    """The engine stopped: a step failed and every pending request failed with it."""


class RequestFailedError(EngineFailedError):
    """One request could not finish because the engine failed; ``__cause__`` is the error."""


@dataclasses.dataclass
class Request:
    request_id: str
    prompt_token_ids: tuple[int, ...]
    max_new_tokens: int
    output_token_ids: list[int] = dataclasses.field(default_factory=list)
    future: Future[list[int]] = dataclasses.field(default_factory=Future)
    in_flight: bool = False
    retries: int = 0  # recoveries this request went through (executor/model/recovery.py)
    # While its KV cache is rebuilt after a restart: how many of its output tokens the
    # workers have produced again (they are fed back, not appended); None otherwise.
    replay: int | None = None
    trace: Any = None  # its RequestTrace while tracing (executor/model/request_traces.py)

    @property
    def done(self) -> bool:
        return len(self.output_token_ids) >= self.max_new_tokens

    def next_input(self) -> tuple[tuple[int, ...], int]:
        """The tokens to feed next and the position of the first of them.

        A rebuild replays the original steps one by one (prompt, then each output token),
        so every step computes exactly what the uninterrupted run did."""
        k = len(self.output_token_ids) if self.replay is None else self.replay
        if k == 0:
            return self.prompt_token_ids, 0
        return (self.output_token_ids[k - 1],), len(self.prompt_token_ids) + k - 1


@dataclasses.dataclass
class EngineStats:
    """Counters for progress displays and benchmarks; times in seconds."""

    steps: int = 0
    generated_tokens: int = 0
    finished_requests: int = 0
    total_requests: int = 0
    started_at: float = dataclasses.field(default_factory=time.perf_counter)
    idle_since: float | None = None  # when run() last finished every request
    round_trip_s: list[float] = dataclasses.field(default_factory=list)
    model_s: list[float] = dataclasses.field(default_factory=list)

    @property
    def elapsed_s(self) -> float:
        """From the engine's creation to now, or to the end of the last completed run."""
        end = self.idle_since if self.idle_since is not None else time.perf_counter()
        return end - self.started_at

    @property
    def tokens_per_s(self) -> float:
        return self.generated_tokens / max(self.elapsed_s, 1e-9)


@dataclasses.dataclass
class _InFlight:
    batch: ModelBatch
    reply: Future[Any] | ModelOutput | None
    submitted_at: float


class LLMEngine:
    """Drives the model worker through an executor; single-threaded, call from one thread."""

    def __init__(self, executor: ExecutorLike, *, step_timeout: float | None = None,
                 max_concurrent_batches: int | None = None,
                 recovery: RecoveryPolicy = FAIL_STOP, model_name: str = "faultlab") -> None:
        self.executor = executor
        self.step_timeout = step_timeout
        self.slots = max_concurrent_batches or executor.max_concurrent_batches
        self.output_rank = executor.output_rank
        self.stats = EngineStats()
        self._requests: dict[str, Request] = {}  # unfinished, in arrival order
        self._in_flight: collections.deque[_InFlight] = collections.deque()
        self._to_free: list[str] = []  # finished ids whose KV cache the ranks still hold
        self._next_step_id = 0
        self.failure: EngineFailedError | None = None
        self.recovery = Recovery.for_policy(recovery, executor)  # None under fail_stop
        self.traces = RequestTraces.for_engine(model_name)  # None when tracing is off

    # ----------------------------------------------------------------- requests

    def add_request(self, request_id: str, prompt_token_ids: Sequence[int],
                    max_new_tokens: int) -> Future[list[int]]:
        """Queue a request; its Future gets the generated token ids, or the failure."""
        self._raise_if_failed()
        if request_id in self._requests:
            raise ValueError(f"request {request_id!r} is already running")
        if not prompt_token_ids or max_new_tokens < 1:
            raise ValueError(f"request {request_id!r}: needs a prompt and max_new_tokens >= 1")
        request = Request(request_id, tuple(int(t) for t in prompt_token_ids), max_new_tokens)
        request.future.set_running_or_notify_cancel()  # only the engine may end it
        if self.traces is not None:
            self.traces.started(request)
        self._requests[request_id] = request
        self.stats.total_requests += 1
        self.stats.idle_since = None
        return request.future

    def has_unfinished(self) -> bool:
        return bool(self._requests)

    # ----------------------------------------------------------------- the loop

    def step(self) -> list[Request]:
        """Fill the free batch slots, then finish the oldest batch in flight.

        Returns the requests that finished in this step.
        """
        self._raise_if_failed()
        try:
            while len(self._in_flight) < self.slots and self._submit_next():
                pass
            if not self._in_flight:
                return []
            return self._complete_oldest()
        except Exception as exc:  # noqa: BLE001 - re-raised unless recovered
            self._fail_or_recover(exc)
            return []

    def run(self, progress: Callable[[EngineStats], None] | None = None) -> dict[str, list[int]]:
        """Step until every request is done; return request id -> generated tokens."""
        outputs: dict[str, list[int]] = {}
        while self.has_unfinished():
            for request in self.step():
                outputs[request.request_id] = list(request.output_token_ids)
            if progress is not None:
                progress(self.stats)
        self.stats.idle_since = time.perf_counter()
        self.free_finished()
        return outputs

    def generate(self, prompts: Mapping[str, Sequence[int]], max_new_tokens: int,
                 progress: Callable[[EngineStats], None] | None = None) -> dict[str, list[int]]:
        """Add every prompt, run to completion, and return tokens in the prompts' order."""
        futures = {rid: self.add_request(rid, prompt, max_new_tokens)
                   for rid, prompt in prompts.items()}
        outputs = self.run(progress)
        lost = [rid for rid in prompts if rid not in outputs]
        if lost:  # only the restart policy loses a request and goes on with the others
            error = futures[lost[0]].exception(timeout=0)
            raise EngineFailedError(f"{len(lost)} of {len(prompts)} requests lost: "
                                    f"{error}") from error
        return {request_id: outputs[request_id] for request_id in prompts}

    def free_finished(self) -> None:
        """Send a request-less batch so every rank frees the finished requests' KV cache."""
        if self._to_free and not self._in_flight and self.failure is None:
            try:
                self._call(self._make_batch([]), non_block=False)
            except Exception as exc:  # noqa: BLE001 - re-raised unless recovered
                self._fail_or_recover(exc)  # restarted workers hold no cache to free

    # ----------------------------------------------------------------- steps

    def _submit_next(self) -> bool:
        requests = self._schedule()
        if not requests:
            return False
        batch = self._make_batch(requests)
        for request in requests:
            request.in_flight = True
        submitted_at = time.perf_counter()
        if self.traces is None:
            reply = self._call(batch, non_block=self.slots > 1)  # blocks with one slot
        else:
            with self.traces.step(batch, requests):
                reply = self._call(batch, non_block=self.slots > 1)
        self._in_flight.append(_InFlight(batch, reply, submitted_at))
        return True

    def _schedule(self) -> list[Request]:
        """Runnable requests for one batch: an even share when several slots are free."""
        runnable = [r for r in self._requests.values() if not r.in_flight]
        share = math.ceil(len(self._requests) / self.slots)
        return runnable[:share]

    def _make_batch(self, requests: Iterable[Request]) -> ModelBatch:
        inputs = [(r.request_id, *r.next_input()) for r in requests]
        batch = ModelBatch(step_id=self._next_step_id,
                           request_ids=tuple(i[0] for i in inputs),
                           token_ids=tuple(i[1] for i in inputs),
                           positions=tuple(i[2] for i in inputs),
                           finished_request_ids=tuple(self._to_free))
        self._next_step_id += 1
        self._to_free = []
        return batch

    def _call(self, batch: ModelBatch, non_block: bool) -> Any:
        return self.executor.collective_rpc("execute_model", timeout=self.step_timeout,
                                            args=(batch,), non_block=non_block,
                                            unique_reply_rank=self.output_rank)

    def _complete_oldest(self) -> list[Request]:
        entry = self._in_flight[0]
        output = self._wait(entry)
        self._in_flight.popleft()
        self.stats.steps += 1
        self.stats.round_trip_s.append(time.perf_counter() - entry.submitted_at)
        self.stats.model_s.append(output.model_time_s)
        return self._apply(entry.batch, output)

    def _wait(self, entry: _InFlight) -> ModelOutput:
        reply = entry.reply
        if isinstance(reply, Future):
            wait = None if self.step_timeout is None else self.step_timeout + RESULT_SLACK_S
            reply = reply.result(timeout=wait)
        if not isinstance(reply, ModelOutput) or reply.step_id != entry.batch.step_id:
            raise RuntimeError(f"step {entry.batch.step_id}: output rank {self.output_rank} "
                               f"replied {type(reply).__name__}, not this step's ModelOutput")
        return reply

    def _apply(self, batch: ModelBatch, output: ModelOutput) -> list[Request]:
        finished = []
        for request_id, token in zip(output.request_ids, output.sampled_token_ids, strict=True):
            request = self._requests[request_id]
            request.in_flight = False
            if request.replay is not None and self.recovery is not None:
                self.recovery.replayed(request, token)
                continue
            request.output_token_ids.append(token)
            if self.recovery is not None:
                self.recovery.new_token()
            if self.traces is not None:
                self.traces.token(request)
            self.stats.generated_tokens += 1
            if request.done:
                finished.append(self._finish(request))
        return finished

    def _finish(self, request: Request) -> Request:
        del self._requests[request.request_id]
        self._to_free.append(request.request_id)
        self.stats.finished_requests += 1
        if self.traces is not None:
            self.traces.finished(request)
        request.future.set_result(list(request.output_token_ids))
        return request

    # ----------------------------------------------------------------- failure

    def _fail_or_recover(self, cause: Exception) -> None:
        """Recover under the ``restart`` policy; else (or if that fails) fail and raise."""
        if self.recovery is not None:
            error = self.recovery.recover(self, cause)
            if error is None:
                return
            cause = error
        self._fail(cause)
        raise self._failure_again() from cause

    def _fail(self, cause: BaseException) -> None:
        """Fail every pending request with one error naming ``cause``; idempotent."""
        if self.failure is not None:
            return
        self.failure = EngineFailedError(f"engine failed at step {self.failed_step()}: "
                                         f"{self.describe_failure(cause)}")
        self.failure.__cause__ = cause
        for request in self._requests.values():
            error = RequestFailedError(f"request {request.request_id!r} failed: {self.failure}")
            error.__cause__ = cause
            if self.traces is not None:
                self.traces.finished(request, error)
            request.future.set_exception(error)
        self._requests.clear()
        self._in_flight.clear()

    # ------------------------------------------------------------------ recovery's view
    # A recovery policy (executor/model/recovery.py) rebuilds requests through these four,
    # never through the engine's own fields: the engine owns its queues.

    @property
    def unfinished_requests(self) -> list[Request]:
        """Every request not yet finished, in arrival order."""
        return list(self._requests.values())

    def begin_rebuild(self) -> list[Request]:
        """The executor was restarted: every call of the old incarnation has failed and the
        new workers hold no cache, so forget both; return the requests to rebuild or drop."""
        self._in_flight.clear()
        self._to_free = []
        for request in self._requests.values():
            request.in_flight = False
        return self.unfinished_requests

    def rebuild(self, request: Request) -> None:
        """Feed ``request``'s prompt and kept tokens again, one step per original step."""
        request.replay = 0 if request.output_token_ids else None

    def drop(self, request: Request, error: BaseException) -> None:
        """End one unfinished request with ``error`` (its future, its trace) and forget it."""
        del self._requests[request.request_id]
        if self.traces is not None:
            self.traces.finished(request, error)
        request.future.set_exception(error)

    def failed_step(self) -> int:
        """The oldest batch in flight, else the last one made (a blocking call failed)."""
        return self._in_flight[0].batch.step_id if self._in_flight else self._next_step_id - 1

    def describe_failure(self, cause: BaseException) -> str:
        """Lead with the executor's own failure when it has one: it names the dead rank."""
        raised = f"{type(cause).__name__}: {_first_line(cause)}"
        executor_error = self._executor_failure(cause)
        if executor_error is cause:
            return raised
        if executor_error is not None:
            return f"{_first_line(executor_error)} (the step raised {raised})"
        if isinstance(cause, TimeoutError):
            return (f"no reply within the step timeout of {self.step_timeout}s (a rank is "
                    f"hung or too slow; worker processes: {self._worker_states()}) — {raised}")
        return raised

    def _executor_failure(self, cause: BaseException) -> BaseException | None:
        """The executor's own failure, if it has one: it names the rank that died.

        A step's error can overtake the executor's death detection (a rank's peer sees the
        closed connection first), so wait up to ``DEATH_GRACE_S`` for it, except after a
        timeout, where the executor is usually still alive.
        """
        if _is_executor_failed(cause):
            return cause
        grace = 0.0 if isinstance(cause, TimeoutError) else DEATH_GRACE_S
        deadline = time.monotonic() + grace
        while not self.executor.is_failed and time.monotonic() < deadline:
            time.sleep(0.01)
        if not self.executor.is_failed:
            return None
        try:
            self.executor.check_health()
        except ExecutorFailedError as exc:
            return exc
        return None

    def _worker_states(self) -> str:
        """'rank 0 (pid 12) running, rank 1 (pid 13) stopped': which rank hangs, at a glance."""
        import psutil

        states = []
        for rank, pid in enumerate(self.executor.worker_pids):
            try:
                status = psutil.Process(pid).status()
            except psutil.Error:
                status = "gone"
            states.append(f"rank {rank} (pid {pid}) {status}")
        return ", ".join(states)

    def _raise_if_failed(self) -> None:
        if self.failure is not None:
            raise self._failure_again()

    def _failure_again(self) -> EngineFailedError:
        assert self.failure is not None
        error = EngineFailedError(str(self.failure))
        error.__cause__ = self.failure.__cause__
        return error


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else repr(exc)


def _is_executor_failed(exc: BaseException) -> bool:
    return isinstance(exc, ExecutorFailedError)


def generation_workload(prompts: Mapping[str, Sequence[int]], max_new_tokens: int, *,
                        step_timeout: float | None = 30.0, recovery: RecoveryPolicy = FAIL_STOP,
                        ) -> Callable[[ExecutorLike], dict[str, list[int]]]:
    """A workload for chaos scenarios: ``workload(executor)`` generates every prompt on the
    model worker and returns the tokens, or raises ``EngineFailedError`` naming the fault."""

    def workload(executor: ExecutorLike) -> dict[str, list[int]]:
        engine = LLMEngine(executor, step_timeout=step_timeout, recovery=recovery)
        return engine.generate(prompts, max_new_tokens)

    return workload
