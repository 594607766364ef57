"""A recorded run as OTLP JSON: one ExportTraceServiceRequest in the OTLP/HTTP JSON encoding.

Data flow::

    list[RecordedSpan] ──► otel.to_readable_spans ──► SDK encode_spans (protobuf)
                       ──► protobuf JSON mapping ──► ids re-encoded as hex, enums as ints

``write_otlp_json`` writes one such request from a stream of traces (``telemetry.stream``),
converting ``BATCH_SPANS`` spans at a time: each batch adds its own ``resourceSpans``
entries (a process's resource may repeat; receivers merge them), so memory stays bounded.

The OTLP JSON encoding differs from the plain protobuf JSON mapping in two ways that
matter here: trace and span ids are lowercase hex (not base64) and enums are integers.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable
from typing import Any, TextIO

from google.protobuf import json_format
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

from telemetry.assemble import RecordedSpan
from telemetry.otel import to_readable_spans

_ID_FIELDS = ("traceId", "spanId", "parentSpanId")
BATCH_SPANS = 4096


def _hex_ids(obj: dict[str, Any]) -> None:
    for field in _ID_FIELDS:
        if obj.get(field):
            obj[field] = base64.b64decode(obj[field]).hex()


def to_otlp_json(spans: list[RecordedSpan]) -> dict[str, Any]:
    request = encode_spans(to_readable_spans(spans))
    doc: dict[str, Any] = json_format.MessageToDict(request, use_integers_for_enums=True)
    for resource_spans in doc.get("resourceSpans", []):
        for scope_spans in resource_spans.get("scopeSpans", []):
            for span in scope_spans.get("spans", []):
                _hex_ids(span)
                for link in span.get("links", []):
                    _hex_ids(link)
    return doc


def write_otlp_json(traces: Iterable[list[RecordedSpan]], out: TextIO) -> int:
    """Write ``{"resourceSpans": [...]}`` to ``out``, a batch of traces at a time; the span
    count."""
    out.write('{"resourceSpans":[')
    sep, count, batch = "", 0, []
    for spans in _batches(traces):
        batch = to_otlp_json(spans).get("resourceSpans", [])
        for resource_spans in batch:
            out.write(sep)
            out.write(json.dumps(resource_spans, separators=(",", ":")))
            sep = ","
        count += len(spans)
    out.write("]}")
    return count


def _batches(traces: Iterable[list[RecordedSpan]]) -> Iterable[list[RecordedSpan]]:
    batch: list[RecordedSpan] = []
    for spans in traces:
        batch.extend(spans)
        if len(batch) >= BATCH_SPANS:
            yield batch
            batch = []
    if batch:
        yield batch
