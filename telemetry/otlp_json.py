"""A recorded run as OTLP JSON: one ExportTraceServiceRequest in the OTLP/HTTP JSON encoding.

Data flow::

    list[RecordedSpan] ──► otel.to_readable_spans ──► SDK encode_spans (protobuf)
                       ──► protobuf JSON mapping ──► ids re-encoded as hex, enums as ints

The OTLP JSON encoding differs from the plain protobuf JSON mapping in two ways that
matter here: trace and span ids are lowercase hex (not base64) and enums are integers.
"""

from __future__ import annotations

import base64
from typing import Any

from google.protobuf import json_format
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

from telemetry.assemble import RecordedSpan
from telemetry.otel import to_readable_spans

_ID_FIELDS = ("traceId", "spanId", "parentSpanId")


def _hex_ids(obj: dict[str, Any]) -> None:
    for field in _ID_FIELDS:
        if obj.get(field):
            obj[field] = base64.b64decode(obj[field]).hex()


def to_otlp_json(spans: list[RecordedSpan]) -> dict[str, Any]:
    request = encode_spans(to_readable_spans(spans))
    doc = json_format.MessageToDict(request, use_integers_for_enums=True)
    for resource_spans in doc.get("resourceSpans", []):
        for scope_spans in resource_spans.get("scopeSpans", []):
            for span in scope_spans.get("spans", []):
                _hex_ids(span)
                for link in span.get("links", []):
                    _hex_ids(link)
    return doc
