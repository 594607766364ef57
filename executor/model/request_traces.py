"""Request-level traces of the engine: one SERVER span per generation request.

Data flow (tracing on; with it off the engine holds no ``RequestTraces`` and calls nothing)::

    add_request ─► started(): span "text_completion <model>" (SERVER, gen_ai.* attributes),
                   a child of telemetry.caller_parent(): the caller's trace, else its own
    each step   ─► step(): span "engine.step" linked to the spans of the requests in the
                   batch, ended before the batch is sent; the step's "rpc execute_model" span
                   is its child (telemetry.use_parent) and inherits those links when the run
                   is told (telemetry/story.py)
    tokens      ─► token(): the first token's time; ends a rebuild span
    done        ─► finished(): the request span ends with token counts and latencies
                   (queue, first token, end to end), or with the error that failed it
    recovery    ─► recovery_started(): engine.recovery links to every unfinished request;
                   rebuild_started(): span "engine.rebuild" in the request's trace (child of
                   its span), linked to the recovery span, from the restart to the request's
                   first new token; the story links it to the fault and its detection

Invariants:

- Attribute names follow the OpenTelemetry gen_ai conventions (``gen_ai.operation.name``,
  ``gen_ai.request.model``, ``gen_ai.usage.input_tokens`` / ``output_tokens``; the span is
  named ``{operation} {model}``) plus the reference engine's ``gen_ai.request.id`` and
  ``gen_ai.latency.*`` (seconds).
- A span's links are recorded before it ends (telemetry/links.py); the step span ends before
  its RPC starts, so even live export sees the links before the RPC.
- A request span ends exactly once: ``finished`` clears ``request.trace``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import telemetry
from telemetry.links import record_links

if TYPE_CHECKING:
    from executor.model.batch import ModelBatch
    from executor.model.engine import Request

OPERATION = "text_completion"
PROVIDER = "faultlab"


@dataclasses.dataclass
class RequestTrace:
    """One request's span and the times (``perf_counter``) its latencies are made of."""

    span: Any
    arrived: float
    scheduled: float | None = None
    first_token: float | None = None
    rebuild: Any = None  # the open engine.rebuild span after a recovery


class RequestTraces:
    """The request, step and rebuild spans of one engine."""

    def __init__(self, rec: telemetry.Recorder, model: str) -> None:
        self.rec = rec
        self.model = model
        self.name = f"{OPERATION} {model}"

    @classmethod
    def for_engine(cls, model: str) -> RequestTraces | None:
        rec = telemetry.get_recorder()
        return cls(rec, model) if rec.enabled else None

    def started(self, request: Request) -> None:
        span = self.rec.start_span(self.name, telemetry.caller_parent(), {
            "span.kind": "server", "gen_ai.operation.name": OPERATION,
            "gen_ai.provider.name": PROVIDER, "gen_ai.request.model": self.model,
            "gen_ai.request.id": request.request_id,
            "gen_ai.request.max_tokens": request.max_new_tokens,
            "gen_ai.usage.input_tokens": len(request.prompt_token_ids),
        })
        request.trace = RequestTrace(span, time.perf_counter())

    @contextlib.contextmanager
    def step(self, batch: ModelBatch, requests: Iterable[Request]) -> Iterator[None]:
        """Around the step's call: its RPC span becomes the step span's child."""
        now = time.perf_counter()
        traces = [r.trace for r in requests if r.trace is not None]
        for trace in traces:
            if trace.scheduled is None:
                trace.scheduled = now
        span = self.rec.start_span("engine.step", telemetry.caller_parent(), {
            "faultlab.step": batch.step_id, "faultlab.batch.requests": len(batch.request_ids),
            "faultlab.batch.tokens": sum(len(t) for t in batch.token_ids),
        })
        record_links(span, "request", (t.span.context for t in traces))
        span.end()
        with telemetry.use_parent(span.context):
            yield

    def token(self, request: Request) -> None:
        """A new (not replayed) token of ``request``."""
        trace = request.trace
        if trace is None:
            return
        if trace.first_token is None:
            trace.first_token = time.perf_counter()
        if trace.rebuild is not None:
            trace.rebuild.end()
            trace.rebuild = None

    def finished(self, request: Request, error: BaseException | None = None) -> None:
        trace, request.trace = request.trace, None
        if trace is None:
            return
        now = time.perf_counter()
        attrs: dict[str, Any] = {
            "gen_ai.usage.output_tokens": len(request.output_token_ids),
            "gen_ai.latency.e2e": now - trace.arrived,
            "faultlab.request.retries": request.retries,
        }
        if trace.scheduled is not None:
            attrs["gen_ai.latency.time_in_queue"] = trace.scheduled - trace.arrived
        if trace.first_token is not None:
            attrs["gen_ai.latency.time_to_first_token"] = trace.first_token - trace.arrived
        if error is None:
            attrs["gen_ai.response.finish_reasons"] = ["length"]
        if trace.rebuild is not None:
            trace.rebuild.end(error or "the request ended before its first new token")
        trace.span.set_attributes(attrs)
        trace.span.end(error)

    # ------------------------------------------------------------ recovery

    def recovery_started(self, span: Any, requests: Iterable[Request]) -> None:
        """Link the ``engine.recovery`` span to the trace of every request it rebuilds."""
        record_links(span, "request", (r.trace.span.context for r in requests
                                       if r.trace is not None))

    def rebuild_started(self, request: Request, recovery: Any) -> None:
        trace = request.trace
        if trace is None:
            return
        if trace.rebuild is not None:  # a second failure before the first rebuild finished
            trace.rebuild.end("interrupted by another failure")
        trace.rebuild = self.rec.start_span("engine.rebuild", trace.span.context, {
            "gen_ai.request.id": request.request_id, "faultlab.request.retries": request.retries,
            "faultlab.tokens_recomputed": len(request.output_token_ids),
        })
        if recovery is not None:
            record_links(trace.rebuild, "recovery", [recovery.context])
