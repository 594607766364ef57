"""The caller's trace: faultlab's root spans join the trace their caller is in.

Data flow::

    faultlab code about to start a root span (an RPC, start-up, a restart, a request)
        └─► caller_parent() ─► 1. a faultlab scope: use_parent(ctx) around a call
                                  (the engine's step or recovery span, the executor's
                                  restart span: what they call becomes their child)
                               2. the current OpenTelemetry span of this thread
                                  (opentelemetry-api), when it has a valid context
                               3. the ``TRACEPARENT`` environment variable (W3C)
                               4. None: the span starts its own trace
        ─► SpanContext ─► Recorder.start_span(name, parent) ─► the caller's trace id

Invariants:

- Cheap when there is nothing to join (it runs on the traced RPC path): a context-variable
  read, a ``sys.modules`` lookup (the OpenTelemetry API is consulted only once the caller
  has imported it; nothing is imported here) and one environment read, whose value is
  parsed once per distinct string.
- Never raises: a malformed ``TRACEPARENT`` is ignored with one warning per value, and a
  failing OpenTelemetry API counts as "no caller context".
- Sampling follows the caller (parent-based): an unsampled caller span makes faultlab's
  spans unsampled too, as with any parent.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import re
import sys
from collections.abc import Iterator

from telemetry.span import FLAG_SAMPLED, SpanContext

log = logging.getLogger(__name__)

TRACEPARENT_ENV = "TRACEPARENT"
_TRACEPARENT_RE = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")
_SCOPE: contextvars.ContextVar[SpanContext | None] = contextvars.ContextVar(
    "faultlab_parent", default=None)
_parsed: tuple[str, SpanContext | None] = ("", None)  # the last TRACEPARENT value seen
# CPython's os.environ keeps its encoded items in ``_data``: a plain dict lookup there costs
# ~30 ns where ``os.environ.get`` of a missing name costs ~500 ns (it raises KeyError inside).
_ENV_DATA: dict[bytes, bytes] | None = getattr(os.environ, "_data", None)
_ENV_KEY = os.fsencode(TRACEPARENT_ENV)


def caller_parent() -> SpanContext | None:
    """The context faultlab's next root span should be a child of, or None (see above)."""
    scoped = _SCOPE.get()
    if scoped is not None:
        return scoped
    otel = sys.modules.get("opentelemetry.context")
    if otel is not None:
        current = _otel_current(otel)
        if current is not None:
            return current
    if _ENV_DATA is not None:
        value = _ENV_DATA.get(_ENV_KEY)
        if not value:
            return None
        raw = os.fsdecode(value)
    else:  # pragma: no cover - not CPython
        raw = os.environ.get(TRACEPARENT_ENV, "")
        if not raw:
            return None
    if raw != _parsed[0]:
        _remember(raw)
    return _parsed[1]


@contextlib.contextmanager
def use_parent(ctx: SpanContext | None) -> Iterator[None]:
    """Within the block, ``caller_parent()`` in this thread returns ``ctx`` (None: no change)."""
    if ctx is None:
        yield
        return
    token = _SCOPE.set(ctx)
    try:
        yield
    finally:
        _SCOPE.reset(token)


def parse_traceparent(value: str) -> SpanContext:
    """A W3C ``traceparent`` value as a ``SpanContext``; ValueError naming what is wrong."""
    match = _TRACEPARENT_RE.match(value.strip().lower())
    if match is None:
        raise ValueError(f"traceparent {value!r} is not 'version-trace_id(32 hex)-"
                         "span_id(16 hex)-flags(2 hex)'")
    version, trace_hex, span_hex, flags_hex, rest = match.groups()
    if version == "ff" or (version == "00" and rest):
        raise ValueError(f"traceparent {value!r}: version {version} is not valid here")
    trace_id, span_id = int(trace_hex, 16), int(span_hex, 16)
    if not trace_id or not span_id:
        raise ValueError(f"traceparent {value!r}: an all-zero trace or span id is invalid")
    return SpanContext(trace_id, span_id, bool(int(flags_hex, 16) & FLAG_SAMPLED))


def _remember(raw: str) -> None:
    global _parsed
    try:
        ctx: SpanContext | None = parse_traceparent(raw)
    except ValueError as exc:
        log.warning("ignoring %s: %s", TRACEPARENT_ENV, exc)
        ctx = None
    _parsed = (raw, ctx)


def _otel_current(otel: object) -> SpanContext | None:
    """The current OpenTelemetry span's context, if valid; never raises.

    ``otel`` is ``opentelemetry.context``; a context holding a span means
    ``opentelemetry.trace`` is imported too (it put the span there)."""
    try:
        current = otel.get_current()  # type: ignore[attr-defined]
        if not current:  # the empty context: no span (the common case, and the cheap one)
            return None
        trace = sys.modules.get("opentelemetry.trace")
        if trace is None:
            return None
        ctx = trace.get_current_span(current).get_span_context()
        if not ctx.is_valid:
            return None
        return SpanContext(ctx.trace_id, ctx.span_id, bool(ctx.trace_flags & FLAG_SAMPLED))
    except Exception:  # noqa: BLE001 - a broken API is no caller context
        return None
