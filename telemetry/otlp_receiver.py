"""A loopback OTLP/HTTP receiver: spans that a program under observation sends of itself.

Data flow::

    target process (OpenTelemetry SDK, OTLPSpanExporter http/protobuf)
        POST http://127.0.0.1:PORT/v1/traces   body: ExportTraceServiceRequest (protobuf),
        │                                      gzip or deflate when Content-Encoding says so
        ▼
    OtlpReceiver (ThreadingHTTPServer on 127.0.0.1, port 0, one thread per request)
        read the body (Content-Length bytes, within ``request_timeout_s`` in all)
        inflate it (never past MAX_BODY_BYTES) ──► decode ──► ReceivedSpan (name, ids,
            times, kind, status, attributes, events, resource attributes, scope) ──► .spans()
        reply 200 ExportTraceServiceResponse; 400 undecodable, truncated or shorter than
              its Content-Length, 404 another path, 408 body too slow, 411 no length,
              413 too large (sent or inflated), 415 another encoding or content type,
              503 cut by stop(); a malformed request line or header: http.server's 4xx

Invariants:

- It listens on loopback only, on a port the kernel picks: nothing off the machine reaches
  it, and two runs never collide.
- Memory is bounded per request by MAX_BODY_BYTES twice over (the body as sent, and as
  inflated: a gzip bomb is refused after MAX_BODY_BYTES + 1 inflated bytes, never held).
- ``stop()`` is bounded whatever a client does: it stops accepting, then cuts the reading
  side of every open connection (``_Connections``), so a request still being read ends at
  once (answered 503 and counted), one already read is finished; then it joins every
  request thread.  A connection that sent nothing is closed without an answer (no request
  was made).  Without ``stop()``, a request that takes over ``request_timeout_s`` to send
  its body is answered 408: a slow client cannot hold a thread forever.
- Every bad request is answered with its status and a one-line reason (when the client can
  still read it), counted in ``rejected``, and never raises in the server or loses the spans
  received before it.
- ``spans()`` is a snapshot, safe to call while requests arrive.
"""

from __future__ import annotations

import dataclasses
import socket
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

TRACES_PATH = "/v1/traces"
MAX_BODY_BYTES = 64 << 20  # as sent and as inflated
_READ_BYTES = 1 << 16  # read and inflate at most this much at a time
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
_KINDS = {0: "internal", 1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}
_STATUS = {0: "UNSET", 1: "OK", 2: "ERROR"}


class Refused(Exception):
    """A request refused with ``status`` and a one-line reason (the exception's text)."""

    def __init__(self, status: int, why: str) -> None:
        super().__init__(why)
        self.status = status


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


class _Connections:
    """The open request connections, so that ``stop()`` can cut them.

    A connection registers from its own thread (``opened``); one that registers after
    ``cut_all`` (accepted just before the server stopped) is cut at once, so none escapes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self.stopping = False

    def opened(self, conn: socket.socket) -> None:
        with self._lock:
            self._open.add(conn)
            if self.stopping:
                _cut(conn)

    def closed(self, conn: socket.socket) -> None:
        with self._lock:
            self._open.discard(conn)

    def cut_all(self) -> None:
        with self._lock:
            self.stopping = True
            for conn in self._open:
                _cut(conn)

    def __len__(self) -> int:
        with self._lock:
            return len(self._open)


def _cut(conn: socket.socket) -> None:
    """End the reading side: a blocked read returns end-of-file; the reply can still go."""
    try:
        conn.shutdown(socket.SHUT_RD)
    except OSError:
        pass  # already gone


class OtlpReceiver:
    """``with OtlpReceiver() as r:`` ... ``r.endpoint`` (the full traces URL) ... ``r.spans()``."""

    def __init__(self, host: str = "127.0.0.1", request_timeout_s: float = 10.0) -> None:
        self._lock = threading.Lock()
        self._spans: list[ReceivedSpan] = []
        self.requests = 0
        self.rejected: list[str] = []
        self.connections = _Connections()
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
        """Stop accepting, cut every request still being read (answered 503), end every
        request thread, close the socket; bounded whatever clients do; safe to call twice."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._server.shutdown()
            thread.join()
        self.connections.cut_all()
        self._server.server_close()

    def __enter__(self) -> OtlpReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def spans(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self._spans)

    def open_requests(self) -> int:
        """Connections accepted and not yet closed (a request being read or answered)."""
        return len(self.connections)

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
        timeout = timeout_s  # a silent client cannot hold a thread forever

        def setup(self) -> None:
            super().setup()
            receiver.connections.opened(self.connection)

        def finish(self) -> None:
            try:
                super().finish()
            except OSError:
                pass  # the client is gone: nothing left to flush
            finally:
                receiver.connections.closed(self.connection)

        def handle(self) -> None:
            try:
                super().handle()
            except OSError:
                pass  # the client went away mid-reply: the request was counted already

        def do_POST(self) -> None:
            try:
                self._receive()
            except Refused as refused:
                self.send_error(refused.status, str(refused))
                return
            body = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def send_error(self, code: int, message: str | None = None,
                       explain: str | None = None) -> None:
            """Every refusal, ours or http.server's (a bad request line, an unknown method),
            is counted and answered with its one-line reason as a text body."""
            why = message or self.responses.get(code, ("", ""))[0]
            receiver.reject(f"{code} {why}")
            body = why.encode("utf-8", "replace")
            self.close_connection = True
            self.send_response(code)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _receive(self) -> None:
            if self.path.split("?", 1)[0] != TRACES_PATH:
                raise Refused(404, f"only POST {TRACES_PATH} is served")
            kind = (self.headers.get("Content-Type") or "").split(";")[0].strip()
            if kind != "application/x-protobuf":
                raise Refused(415, f"content type {kind!r}: only application/x-protobuf is read")
            encoding = (self.headers.get("Content-Encoding") or "").strip().lower()
            if encoding not in ("", "identity", *_WBITS):
                raise Refused(415, f"content encoding {encoding!r}: only gzip, deflate or "
                                   "none is read")
            length = self.headers.get("Content-Length")
            if length is None or not length.isdigit():
                raise Refused(411, "a Content-Length is required")
            if int(length) > MAX_BODY_BYTES:
                raise Refused(413, f"{length} bytes is over the {MAX_BODY_BYTES} byte limit")
            body = inflate(self._read_body(int(length)), encoding)
            try:
                receiver.accept(body)
            except DecodeError as exc:
                raise Refused(400, f"undecodable request: {type(exc).__name__}: {exc}") from None

        def _read_body(self, length: int) -> bytes:
            """Exactly ``length`` bytes, within ``timeout_s`` in all (not per read)."""
            deadline = time.monotonic() + timeout_s
            body = bytearray()
            while len(body) < length:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise Refused(408, f"the body was not sent within {timeout_s:g} s: "
                                       f"{len(body)} of its {length} bytes came")
                self.connection.settimeout(left)
                try:
                    chunk = self.rfile.read1(min(length - len(body), _READ_BYTES))
                except TimeoutError:
                    continue  # the deadline above refuses it
                if not chunk:
                    raise self._ended(len(body), length)
                body += chunk
            return bytes(body)

        def _ended(self, got: int, length: int) -> Refused:
            if receiver.connections.stopping:
                return Refused(503, f"the receiver stopped after {got} of the body's "
                                    f"{length} bytes")
            return Refused(400, f"the body ended after {got} of its {length} Content-Length "
                                "bytes")

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


def inflate(body: bytes, encoding: str, limit: int = MAX_BODY_BYTES) -> bytes:
    """The body as sent, inflated (gzip: every member), never more than ``limit`` bytes:
    raises ``Refused`` 413 past it, 400 for a corrupt or truncated stream."""
    wbits = _WBITS.get(encoding)
    if wbits is None:
        return body
    out = bytearray()
    data = body
    while True:
        inflater = zlib.decompressobj(wbits)
        try:
            data = _inflate_member(inflater, data, out, limit, encoding)
        except zlib.error as exc:
            raise Refused(400, f"undecodable request: corrupt {encoding} body: {exc}") from None
        if not inflater.eof:
            raise Refused(400, f"truncated {encoding} body: its {len(body)} bytes end before "
                               f"the compressed stream does")
        if encoding != "gzip" or not data.strip(b"\0"):
            return bytes(out)  # trailing zeros are padding, as gzip.decompress takes them


def _inflate_member(inflater: Any, data: bytes, out: bytearray, limit: int,
                    encoding: str) -> bytes:
    """Inflate one compressed stream into ``out`` a bounded piece at a time; the bytes
    after it (another gzip member, or nothing)."""
    while not inflater.eof:
        piece = inflater.decompress(data, min(_READ_BYTES, limit + 1 - len(out)))
        out += piece
        if len(out) > limit:
            raise Refused(413, f"the {encoding} body inflates to more than the "
                               f"{limit} byte limit")
        if not piece and not data:
            break  # no input left and no output pending: the stream was cut short
        data = inflater.unconsumed_tail
    return inflater.unused_data if inflater.eof else b""


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
