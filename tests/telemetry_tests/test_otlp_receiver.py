"""telemetry.otlp_receiver: the loopback OTLP/HTTP receiver a chaos target exports to.

A real OpenTelemetry SDK (TracerProvider + the OTLP/HTTP span exporter, plain and gzip) sends
to it; the test compares what arrived with the SDK's own span contexts.  Bad requests get
their status and leave what was received before; stop() leaves no thread behind.
"""

from __future__ import annotations

import gzip
import http.client
import threading
from urllib.parse import urlsplit

import pytest
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind, Status, StatusCode

from telemetry.otlp_receiver import OtlpReceiver


def _export_two_spans(endpoint: str, compression: Compression) -> tuple[object, object]:
    provider = TracerProvider(resource=Resource({"service.name": "sender", "process.pid": 4242}))
    provider.add_span_processor(SimpleSpanProcessor(
        OTLPSpanExporter(endpoint=endpoint, compression=compression, timeout=10)))
    tracer = provider.get_tracer("test.scope")
    try:
        with tracer.start_as_current_span("llm_request", kind=SpanKind.SERVER,
                                          attributes={"gen_ai.request.id": "7",
                                                      "gen_ai.usage.prompt_tokens": 12}) as parent:
            parent.add_event("first_token", {"tokens": [1, 2]})
            with tracer.start_as_current_span("inner") as child:
                child.set_status(Status(StatusCode.ERROR, "engine dead"))
    finally:
        provider.shutdown()
    return parent.get_span_context(), child.get_span_context()


@pytest.mark.parametrize("compression", [Compression.NoCompression, Compression.Gzip],
                         ids=["plain", "gzip"])
def test_a_real_sdk_export_is_decoded(compression: Compression) -> None:
    with OtlpReceiver() as receiver:
        assert urlsplit(receiver.endpoint).hostname == "127.0.0.1"
        parent_ctx, child_ctx = _export_two_spans(receiver.endpoint, compression)
        spans = {s.name: s for s in receiver.spans()}
    assert receiver.rejected == [] and receiver.requests == 2  # one per span (simple processor)
    parent, child = spans["llm_request"], spans["inner"]
    assert (parent.trace_id, parent.span_id, parent.parent_span_id) == (
        parent_ctx.trace_id, parent_ctx.span_id, 0)  # type: ignore[attr-defined]
    assert (child.trace_id, child.span_id, child.parent_span_id) == (
        child_ctx.trace_id, child_ctx.span_id, parent_ctx.span_id)  # type: ignore[attr-defined]
    assert parent.kind == "server" and child.kind == "internal"
    assert parent.attributes == {"gen_ai.request.id": "7", "gen_ai.usage.prompt_tokens": 12}
    assert [(name, attrs) for name, _, attrs in parent.events] == [("first_token", {"tokens": [1, 2]})]
    assert parent.start_ns <= parent.events[0][1] <= parent.end_ns
    assert (child.status, child.status_message) == ("ERROR", "engine dead")
    assert parent.resource["service.name"] == "sender" and parent.resource["process.pid"] == 4242
    assert parent.scope == "test.scope"


def _post(endpoint: str, body: bytes, path: str | None = None,
          headers: dict[str, str] | None = None) -> tuple[int, str]:
    url = urlsplit(endpoint)
    conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=10)
    try:
        conn.request("POST", path or url.path, body,
                     {"Content-Type": "application/x-protobuf", **(headers or {})})
        reply = conn.getresponse()
        return reply.status, reply.read().decode(errors="replace")
    finally:
        conn.close()


@pytest.mark.parametrize(("path", "headers", "body", "status", "says"), [
    ("/v1/metrics", {}, b"", 404, "/v1/traces"),
    (None, {"Content-Type": "application/json"}, b"{}", 415, "application/x-protobuf"),
    (None, {"Content-Encoding": "br"}, b"x", 415, "'br'"),
    (None, {}, b"\xff\xff\xff\xff", 400, "undecodable"),
    (None, {"Content-Encoding": "gzip"}, b"not gzip", 400, "undecodable"),
    (None, {"Content-Encoding": "gzip"}, gzip.compress(b"\xff\xff\xff"), 400, "undecodable"),
], ids=["path", "json", "brotli", "garbage", "bad-gzip", "gzip-garbage"])
def test_a_bad_request_is_answered_and_keeps_what_came_before(
        path: str | None, headers: dict[str, str], body: bytes, status: int, says: str) -> None:
    with OtlpReceiver() as receiver:
        _export_two_spans(receiver.endpoint, Compression.NoCompression)
        got, text = _post(receiver.endpoint, body, path, headers)
        assert (got, says in text) == (status, True), text
        assert len(receiver.spans()) == 2
        assert receiver.rejected and receiver.rejected[0].startswith(str(status))


def test_stop_joins_every_thread_and_twice_is_harmless() -> None:
    before = set(threading.enumerate())
    receiver = OtlpReceiver().start()
    _export_two_spans(receiver.endpoint, Compression.Gzip)
    receiver.stop()
    receiver.stop()
    assert set(threading.enumerate()) - before == set()
    with pytest.raises(OSError):
        _post(receiver.endpoint, b"")  # the port is closed
