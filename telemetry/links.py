"""Span links written while recording: a span names the spans it relates to (in any trace).

Data flow::

    hot path: record_links(span, "request", [ctx, ...])
        ─► attribute ``faultlab.links.request`` = "<trace 32 hex><span 16 hex>..."
           (ordinary ATTRIBUTE + STRING journal records; long lists split over
           ``faultlab.links.request.1``, ``.2``, ... so no string is cut)
    load / export: take_links(recorded_span)
        ─► RecordedLink(trace_id, span_id, {"faultlab.link": role}) per target; the
           ``faultlab.links.*`` attributes are removed, so exporters show real links only

Invariants:

- No new journal record kind: links are attributes, so every reader of older journals and
  the hot path's record layout stay as they are.  A span's links must be recorded before
  it ends (attributes of an ended span are dropped by the decoder, as always).
- ``take_links`` is idempotent: a link already present (same span id) is not added twice.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from telemetry.journal import MAX_STRING

if TYPE_CHECKING:  # the reading side (numpy, psutil) stays out of the recording processes
    from telemetry.assemble import RecordedLink, RecordedSpan
    from telemetry.span import SpanContext

PREFIX = "faultlab.links."
_ONE = 48  # hex characters per link: 32 (trace id) + 16 (span id)
_PER_KEY = MAX_STRING // _ONE


def record_links(span: Any, role: str, targets: Iterable[SpanContext | None]) -> None:
    """Link ``span`` (a recording ``telemetry.Span``) to ``targets`` under ``role``."""
    encoded = [f"{t.trace_id:032x}{t.span_id:016x}" for t in targets if t is not None]
    if not encoded or not span.is_recording:
        return
    attrs = {}
    for part, start in enumerate(range(0, len(encoded), _PER_KEY)):
        key = PREFIX + role if part == 0 else f"{PREFIX}{role}.{part}"
        attrs[key] = "".join(encoded[start:start + _PER_KEY])
    span.set_attributes(attrs)


def take_links(span: RecordedSpan) -> None:
    """Turn a recorded span's ``faultlab.links.*`` attributes into its ``links``."""
    keys = [k for k in span.attributes if k.startswith(PREFIX)]
    for key in sorted(keys):
        role = key[len(PREFIX):].split(".", 1)[0]
        raw = str(span.attributes.pop(key))
        for i in range(0, len(raw) - _ONE + 1, _ONE):
            try:
                trace_id, span_id = int(raw[i:i + 32], 16), int(raw[i + 32:i + _ONE], 16)
            except ValueError:
                continue  # a torn or foreign value
            add_link(span, trace_id, span_id, {"faultlab.link": role})


def add_link(span: RecordedSpan, trace_id: int, span_id: int, attributes: dict[str, Any]) -> bool:
    """Add one link unless ``span`` already links to ``span_id``; True if added."""
    from telemetry.assemble import RecordedLink

    if span_id == span.span_id or any(link.span_id == span_id for link in span.links):
        return False
    span.links.append(RecordedLink(trace_id, span_id, dict(attributes)))
    return True


def linked(span: RecordedSpan, role: str) -> list[RecordedLink]:
    """The span's links of one role."""
    return [link for link in span.links if link.attributes.get("faultlab.link") == role]
