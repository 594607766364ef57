"""Recorded spans as real OpenTelemetry SDK spans, and the SDK exporters that ship them.

Data flow::

    RecordedSpan ──► to_readable_span() ──► opentelemetry.sdk.trace.ReadableSpan
                                                   │
    make_exporter(protocol, endpoint) ──► OTLPSpanExporter (http/protobuf | grpc) / Console
                                                   │
    export_spans(exporter, spans) ─────────────────┘  in batches

Invariants:

- Ids, parents, times, attributes, events and status are exactly the recorded ones; a
  span its process never ended is exported ending at the journal's last timestamp with
  ``faultlab.truncated = true`` and status ERROR, so it stands out in Jaeger.
- One ``Resource`` per process incarnation: ``service.name`` per role (``faultlab driver``,
  ``faultlab worker rank 1``; the configured name is ``service.namespace``),
  ``service.instance.id`` (``worker rank 1 pid 4242``, as in the Jaeger JSON),
  ``process.pid``, ``faultlab.role``, ``faultlab.rank``, plus ``OTEL_RESOURCE_ATTRIBUTES``.
  A failed RPC's ``story_spans`` (the victim's row) are exported after it.  The SDK's
  ``Resource.create`` (detectors, environment) runs once, in ``base_resource()``; each
  process's resource is that base merged with its own attributes, which starts no thread
  and so also works while the interpreter exits (``Resource.create`` starts a thread pool,
  which fails once shutdown began).
- A span's kind is the one ``telemetry.story`` gave it (a ``span.kind`` attribute wins);
  its parent is remote only when recorded by another process; a worker's span name shows
  its rank (``naming.display_name``) and every span of a ranked process has ``faultlab.rank``.
- A truncated span ends at its process's best-known death (``RecordedSpan.shown_end_ns``)
  with ``faultlab.truncated.reason``.
"""

from __future__ import annotations

import socket
from collections.abc import Iterable, Sequence
from urllib.parse import urlsplit

from opentelemetry import trace as trace_api
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanKind, Status, StatusCode, TraceFlags

from telemetry.assemble import ProcessInfo, RecordedSpan
from telemetry.naming import display_name, export_attributes, instance_id, service_name

SCOPE = InstrumentationScope("faultlab.telemetry", "0.1.0")
BATCH_SIZE = 512
TRUNCATED_MESSAGE = "truncated: the process ended before this span ended"
_KINDS = {
    "client": SpanKind.CLIENT, "server": SpanKind.SERVER, "producer": SpanKind.PRODUCER,
    "consumer": SpanKind.CONSUMER, "internal": SpanKind.INTERNAL,
}
_HOST = socket.gethostname()


def truncated_message(span: RecordedSpan) -> str:
    """The status description of a truncated span: why, and where its bar ends."""
    reason = span.truncated_reason or TRUNCATED_MESSAGE.removeprefix("truncated: ")
    return f"truncated: {reason}"


def base_resource() -> Resource:
    """What every exported process shares: SDK defaults, detectors, ``OTEL_*`` variables.

    Call it while the interpreter still runs normally: it may start a thread pool.
    """
    return Resource.create({})


def resource_for(process: ProcessInfo, base: Resource | None = None) -> Resource:
    """``process``'s resource; ``base`` is a ``base_resource()`` built earlier."""
    attributes: dict[str, str | int] = {
        "service.name": service_name(process),  # per role: "faultlab worker rank 1"
        "service.namespace": process.service,
        "process.pid": process.pid,
        "host.name": process.host or _HOST,  # recorded in the journal; older ones: here
        "faultlab.role": process.role,
        "faultlab.incarnation": f"{process.incarnation:016x}",
        # As in every export, and stable across replays (Resource.create draws a uuid).
        "service.instance.id": instance_id(process),
    }
    if process.rank is not None:
        attributes["faultlab.rank"] = process.rank
    return (base_resource() if base is None else base).merge(Resource(attributes))


def to_readable_span(span: RecordedSpan, resource: Resource) -> ReadableSpan:
    flags = TraceFlags(TraceFlags.SAMPLED)
    context = trace_api.SpanContext(span.trace_id, span.span_id, False, flags)
    parent = None
    if span.parent_span_id:
        parent = trace_api.SpanContext(
            span.trace_id, span.parent_span_id, span.parent_remote, flags)
    attributes = export_attributes(span)
    explicit = attributes.pop("span.kind", None)
    kind = _KINDS.get(str(explicit or span.kind).lower(), SpanKind.INTERNAL)
    if span.truncated:
        attributes["faultlab.truncated"] = True
        attributes["faultlab.truncated.reason"] = span.truncated_reason or TRUNCATED_MESSAGE
        status = (Status(StatusCode.ERROR, truncated_message(span)) if span.failed
                  else Status(StatusCode.UNSET))  # a survivor the executor stopped
        end_ns = span.shown_end_ns
    else:
        code = StatusCode.ERROR if span.failed else StatusCode.UNSET  # OK: UNSET
        status = Status(code, span.status_message or None if code == StatusCode.ERROR else None)
        end_ns = span.end_ns or span.start_ns
    events = [Event(e.name, dict(e.attributes), e.time_ns) for e in span.events]
    links = [trace_api.Link(trace_api.SpanContext(link.trace_id, link.span_id, False, flags),
                            dict(link.attributes)) for link in span.links]
    return ReadableSpan(
        name=display_name(span), context=context, parent=parent, resource=resource,
        attributes=attributes, events=events, links=links, kind=kind, status=status,
        start_time=span.start_ns, end_time=end_ns, instrumentation_scope=SCOPE,
    )


def to_readable_spans(
    spans: Iterable[RecordedSpan], base: Resource | None = None,
    resources: dict[ProcessInfo, Resource] | None = None,
) -> list[ReadableSpan]:
    """SDK spans; ``resources`` (a cache kept by the caller) maps processes to resources."""
    base = base_resource() if base is None else base
    resources = {} if resources is None else resources
    out = []
    for span in (s for told in spans for s in (told, *told.story_spans)):
        resource = resources.get(span.process)
        if resource is None:
            resource = resources[span.process] = resource_for(span.process, base)
        out.append(to_readable_span(span, resource))
    return out


def traces_endpoint(endpoint: str, protocol: str) -> str:
    """The URL an exporter should use for ``--endpoint``: http needs the ``/v1/traces`` path."""
    if protocol == "grpc":
        return endpoint
    path = urlsplit(endpoint).path
    return endpoint if path.rstrip("/").endswith("/v1/traces") \
        else endpoint.rstrip("/") + "/v1/traces"


def make_exporter(
    exporter: str = "otlp", protocol: str = "http/protobuf", endpoint: str | None = None,
) -> SpanExporter:
    """An SDK span exporter; without ``endpoint`` the exporters read the OTLP variables."""
    if exporter == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcExporter,
        )

        if endpoint is None:
            return GrpcExporter()
        return GrpcExporter(endpoint=endpoint, insecure=urlsplit(endpoint).scheme != "https")
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as HttpExporter,
    )

    return HttpExporter(endpoint=None if endpoint is None else traces_endpoint(endpoint, protocol))


def export_spans(exporter: SpanExporter, spans: Sequence[ReadableSpan]) -> int:
    """Export in batches, stopping at the first refused batch; return how many were sent.

    Stopping early matters: each failed batch can spend the exporter's whole retry budget.
    """
    for start in range(0, len(spans), BATCH_SIZE):
        if exporter.export(spans[start : start + BATCH_SIZE]) != SpanExportResult.SUCCESS:
            return start
    return len(spans)
