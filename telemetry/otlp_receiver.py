"""A loopback OTLP/HTTP receiver: spans that a program under observation sends of itself.

Data flow::

    target process (OpenTelemetry SDK, OTLPSpanExporter http/protobuf)
        POST http://127.0.0.1:PORT/v1/traces   body: ExportTraceServiceRequest (protobuf),
        │                                      gzip when Content-Encoding says so
        ▼
    OtlpReceiver (ThreadingHTTPServer on 127.0.0.1, port 0, one thread per request)
        decode ──► ReceivedSpan (name, ids, times, kind, status, attributes, events,
                                 resource attributes, scope)  ──► .spans()
        reply 200 ExportTraceServiceResponse; 400 undecodable, 404 another path,
              411 no length, 413 too large, 415 another encoding or content type

Invariants:

- It listens on loopback only, on a port the kernel picks: nothing off the machine reaches
  it, and two runs never collide.
- HTTP/1.0, one request per connection, a socket timeout per request: ``stop()`` returns
  once the server and every request thread have ended (it joins them), so a stuck client
  cannot keep a thread alive.
- A bad request is answered with its status and a one-line reason, counted in
  ``rejected``, and never raises in the server or loses the spans received before it.
- ``spans()`` is a snapshot, safe to call while requests arrive.
"""

from __future__ import annotations

import dataclasses
import gzip
import threading
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

TRACES_PATH = "/v1/traces"
MAX_BODY_BYTES = 64 << 20
_KINDS = {0: "internal", 1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}
_STATUS = {0: "UNSET", 1: "OK", 2: "ERROR"}


@dataclasses.dataclass
class ReceivedSpan:
    """One span as the sender exported it (ids as ints, times as epoch nanoseconds)."""

    name: str
    trace_id: int
    span_id: int
    parent_span_id: int  # 0: a root of its own trace
    start_ns: int
    end_ns: int
    kind: str
    status: str
    status_message: str
    attributes: dict[str, Any]
    events: list[tuple[str, int, dict[str, Any]]]
    resource: dict[str, Any]
    scope: str


class OtlpReceiver:
    """``with OtlpReceiver() as r:`` ... ``r.endpoint`` (the full traces URL) ... ``r.spans()``."""

    def __init__(self, host: str = "127.0.0.1", request_timeout_s: float = 10.0) -> None:
        self._lock = threading.Lock()
        self._spans: list[ReceivedSpan] = []
        self.requests = 0
        self.rejected: list[str] = []
        self._server = ThreadingHTTPServer((host, 0), _handler(self, request_timeout_s))
        self._server.daemon_threads = False  # server_close() joins every request thread
        self._thread: threading.Thread | None = None
        port = self._server.server_address[1]
        self.endpoint = f"http://{host}:{port}{TRACES_PATH}"

    def start(self) -> OtlpReceiver:
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,),
                                        name="otlp-receiver", daemon=True)  # poll: stop()'s wait
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, end every request thread, close the socket; safe to call twice."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._server.shutdown()
            thread.join()
        self._server.server_close()

    def __enter__(self) -> OtlpReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def spans(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self._spans)

    def accept(self, body: bytes) -> None:
        """Decode one request body (raises ``DecodeError``) and keep its spans."""
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        spans = decode(request)
        with self._lock:
            self._spans.extend(spans)
            self.requests += 1

    def reject(self, why: str) -> None:
        with self._lock:
            self.rejected.append(why)


def _handler(receiver: OtlpReceiver, timeout_s: float) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        timeout = timeout_s  # a silent client cannot hold stop() forever

        def do_POST(self) -> None:
            status, why = self._receive()
            if status != 200:
                receiver.reject(f"{status} {why}")
            body = ExportTraceServiceResponse().SerializeToString() if status == 200 else \
                why.encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/x-protobuf" if status == 200
                             else "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _receive(self) -> tuple[int, str]:
            if self.path.split("?", 1)[0] != TRACES_PATH:
                return 404, f"only POST {TRACES_PATH} is served"
            kind = (self.headers.get("Content-Type") or "").split(";")[0].strip()
            if kind != "application/x-protobuf":
                return 415, f"content type {kind!r}: only application/x-protobuf is read"
            length = self.headers.get("Content-Length")
            if length is None or not length.isdigit():
                return 411, "a Content-Length is required"
            if int(length) > MAX_BODY_BYTES:
                return 413, f"{length} bytes is over the {MAX_BODY_BYTES} byte limit"
            body = self.rfile.read(int(length))
            try:
                body = _decompress(body, (self.headers.get("Content-Encoding") or "").lower())
                receiver.accept(body)
            except ValueError as exc:  # an encoding we do not read
                return 415, str(exc)
            except (DecodeError, OSError, EOFError, zlib.error) as exc:
                return 400, f"undecodable request: {type(exc).__name__}: {exc}"
            return 200, ""

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


def _decompress(body: bytes, encoding: str) -> bytes:
    if encoding in ("", "identity"):
        return body
    if encoding == "gzip":
        return gzip.decompress(body)
    if encoding == "deflate":
        return zlib.decompress(body)
    raise ValueError(f"content encoding {encoding!r}: only gzip, deflate or none is read")


def decode(request: ExportTraceServiceRequest) -> list[ReceivedSpan]:
    """Every span of one export request, with its resource's and scope's names."""
    out: list[ReceivedSpan] = []
    for resource_spans in request.resource_spans:
        resource = attributes_of(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            scope = scope_spans.scope.name
            out.extend(_span(span, resource, scope) for span in scope_spans.spans)
    return out


def _span(span: Any, resource: dict[str, Any], scope: str) -> ReceivedSpan:
    events = [(e.name, int(e.time_unix_nano), attributes_of(e.attributes)) for e in span.events]
    return ReceivedSpan(
        name=span.name, trace_id=int.from_bytes(span.trace_id, "big"),
        span_id=int.from_bytes(span.span_id, "big"),
        parent_span_id=int.from_bytes(span.parent_span_id, "big") if span.parent_span_id else 0,
        start_ns=int(span.start_time_unix_nano), end_ns=int(span.end_time_unix_nano),
        kind=_KINDS.get(span.kind, "internal"), status=_STATUS.get(span.status.code, "UNSET"),
        status_message=span.status.message, attributes=attributes_of(span.attributes),
        events=events, resource=resource, scope=scope)


def attributes_of(key_values: Any) -> dict[str, Any]:
    """OTLP KeyValues as a dict (arrays as lists, key-value lists as dicts)."""
    return {kv.key: _value(kv.value) for kv in key_values}


def _value(value: Any) -> Any:
    field = value.WhichOneof("value")
    if field is None:
        return None
    if field == "array_value":
        return [_value(v) for v in value.array_value.values]
    if field == "kvlist_value":
        return attributes_of(value.kvlist_value.values)
    if field == "bytes_value":
        return value.bytes_value.hex()
    return getattr(value, field)
