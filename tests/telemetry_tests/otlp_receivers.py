"""Real OTLP receivers for tests: HTTP (POST /v1/traces) and gRPC (TraceService/Export).

Both decode requests with the official opentelemetry-proto messages and keep them, so a
test can assert on exactly what an exporter sent over the wire.
"""

from __future__ import annotations

import threading
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest


class ReceivedSpans:
    """Requests received so far, flattened to (resource attributes, span) pairs."""

    def __init__(self) -> None:
        self.requests: list[ExportTraceServiceRequest] = []
        self._lock = threading.Lock()

    def add(self, request: ExportTraceServiceRequest) -> None:
        with self._lock:
            self.requests.append(request)

    def spans(self) -> list[tuple[dict[str, Any], Any]]:
        with self._lock:
            requests = list(self.requests)
        out = []
        for request in requests:
            for resource_spans in request.resource_spans:
                resource = attributes_of(resource_spans.resource.attributes)
                for scope_spans in resource_spans.scope_spans:
                    out.extend((resource, span) for span in scope_spans.spans)
        return out


def attributes_of(key_values: Any) -> dict[str, Any]:
    result = {}
    for kv in key_values:
        field = kv.value.WhichOneof("value")
        result[kv.key] = getattr(kv.value, field) if field else None
    return result


class HttpReceiver(ReceivedSpans):
    def __init__(self) -> None:
        super().__init__()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                status = 404
                if self.path == "/v1/traces":
                    request = ExportTraceServiceRequest()
                    request.ParseFromString(body)
                    receiver.add(request)
                    status = 200
                reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(status)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join()


class GrpcReceiver(ReceivedSpans, trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        ReceivedSpans.__init__(self)
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        self.endpoint = f"http://127.0.0.1:{port}"
        self.server.start()

    def Export(self, request: ExportTraceServiceRequest, context: Any) -> Any:
        self.add(request)
        return trace_service_pb2.ExportTraceServiceResponse()

    def close(self) -> None:
        self.server.stop(grace=None).wait()


def base_name(name: str) -> str:
    """An exported span name without the ``[rank N]`` a worker's spans show."""
    import re

    return re.sub(r" \[rank \d+\]$", "", name)
