"""telemetry.otlp_receiver against clients that misbehave (issues 31 and 32).

    client                                       the receiver must
    gzip body inflating to 1 GiB (1 MiB sent)    413 naming the inflation, memory flat
    gzip / deflate body cut short                400 naming the truncation
    body shorter than its Content-Length          400 (client half-closed) or, left open,
                                                  an answer when stop() cuts it; counted
    one byte now and then, never finishing       stop() returns at once; the request answered
    a request in flight when stop() is called    answered and counted; the spans already
                                                  received kept; no thread left

No test hinges on the clock: a slow client is cut by ``stop()`` (which the test calls once
the receiver holds the request), and the bound asserted on ``stop()`` (10 s) is far above
what it takes and far below what the old code took (the trickling client outlives it).
"""

from __future__ import annotations

import gzip
import http.client
import socket
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from telemetry.otlp_receiver import OtlpReceiver

ROOT = Path(__file__).resolve().parents[2]
MIB = 1 << 20
STOP_BOUND_S = 10.0  # the old receiver waited for the trickling client (30 s here)


def _one_span_body() -> bytes:
    request = ExportTraceServiceRequest()
    span = request.resource_spans.add().scope_spans.add().spans.add()
    span.name, span.trace_id, span.span_id = "kept", b"\x01" * 16, b"\x02" * 8
    span.start_time_unix_nano, span.end_time_unix_nano = 1, 2
    return request.SerializeToString()


def _bomb(inflated_mib: int) -> bytes:
    """One gzip stream of zeros, built a MiB at a time (never held inflated here)."""
    z = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(MIB)
    return b"".join([*(z.compress(zeros) for _ in range(inflated_mib)), z.flush()])


def _post(endpoint: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, str]:
    url = urlsplit(endpoint)
    conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=60)
    try:
        conn.request("POST", url.path, body,
                     {"Content-Type": "application/x-protobuf", **(headers or {})})
        reply = conn.getresponse()
        return reply.status, reply.read().decode(errors="replace")
    finally:
        conn.close()


def _raw(endpoint: str, length: int, body: bytes, encoding: str = "") -> socket.socket:
    """A connection that sent headers claiming ``length`` bytes, then ``body``."""
    url = urlsplit(endpoint)
    sock = socket.create_connection((url.hostname or "127.0.0.1", url.port or 0), timeout=60)
    head = (f"POST {url.path} HTTP/1.0\r\nContent-Type: application/x-protobuf\r\n"
            f"Content-Length: {length}\r\n"
            + (f"Content-Encoding: {encoding}\r\n" if encoding else "") + "\r\n")
    sock.sendall(head.encode() + body)
    return sock


def _reply(sock: socket.socket) -> str:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


def _wait_holding(receiver: OtlpReceiver, n: int) -> None:
    """Until the receiver holds ``n`` open requests (a condition, not a delay)."""
    while receiver.open_requests() < n:
        time.sleep(0.01)


# ---------------------------------------------------------------- bounded inflation

_SERVE = """
import sys
from telemetry.otlp_receiver import OtlpReceiver

def peak_mib():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) // 1024

with OtlpReceiver() as receiver:
    print(receiver.endpoint, flush=True)
    for line in sys.stdin:
        print(peak_mib(), len(receiver.rejected), flush=True)
"""


@pytest.fixture
def served() -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """A receiver in its own process (its memory measured alone): (endpoint, process)."""
    with subprocess.Popen([sys.executable, "-c", _SERVE], cwd=ROOT, text=True,
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        try:
            yield proc.stdout.readline().strip(), proc
        finally:
            proc.stdin.close()  # the receiver's loop ends, and with it the process
            proc.wait(timeout=60)


def _peak(proc: subprocess.Popen[str]) -> tuple[int, int]:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("peak\n")
    proc.stdin.flush()
    peak, rejected = proc.stdout.readline().split()
    return int(peak), int(rejected)


def test_a_gzip_bomb_is_refused_with_memory_flat(
        served: tuple[str, subprocess.Popen[str]]) -> None:
    endpoint, proc = served
    assert _post(endpoint, gzip.compress(_one_span_body()), {"Content-Encoding": "gzip"})[0] == 200
    before, _ = _peak(proc)
    bomb = _bomb(1024)
    assert len(bomb) < 2 * MIB
    status, text = _post(endpoint, bomb, {"Content-Encoding": "gzip"})
    after, rejected = _peak(proc)
    print(f"receiver peak RSS: {before} MiB before the bomb, {after} MiB after")
    assert (status, "inflates to more than" in text) == (413, True), text
    assert rejected == 1
    assert after - before < 200, f"peak RSS grew {after - before} MiB for a 1 GiB bomb"


# ---------------------------------------------------------------- short and cut bodies

@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_a_truncated_compressed_body_is_a_400_naming_it(encoding: str) -> None:
    whole = gzip.compress(_one_span_body()) if encoding == "gzip" else \
        zlib.compress(_one_span_body())
    with OtlpReceiver() as receiver:
        status, text = _post(receiver.endpoint, whole[: len(whole) - 6],
                             {"Content-Encoding": encoding})
        assert (status, "truncated" in text) == (400, True), text
        assert receiver.rejected == [f"400 {text}"]


def test_a_body_shorter_than_its_length_is_answered_and_counted() -> None:
    body = _one_span_body()
    with OtlpReceiver() as receiver:
        sock = _raw(receiver.endpoint, len(body) + 100, body)
        sock.shutdown(socket.SHUT_WR)  # the client says it has sent everything
        reply = _reply(sock)
        sock.close()
        assert reply.startswith("HTTP/1.0 400") and "ended after" in reply, reply
        assert len(receiver.rejected) == 1 and receiver.spans() == []


def _trickle(sock: socket.socket, stop: threading.Event) -> None:
    """One byte every 0.5 s for up to 30 s (never the whole body), until told to stop."""
    for _ in range(60):
        if stop.wait(0.5):
            return
        try:
            sock.sendall(b"\x00")
        except OSError:
            return


def test_stop_is_bounded_with_a_trickling_client_which_is_answered() -> None:
    before = set(threading.enumerate())
    receiver = OtlpReceiver().start()
    assert _post(receiver.endpoint, _one_span_body())[0] == 200  # received before: kept
    sock = _raw(receiver.endpoint, 1000, b"\x0a")
    done = threading.Event()
    client = threading.Thread(target=_trickle, args=(sock, done))
    client.start()
    try:
        _wait_holding(receiver, 1)
        t0 = time.monotonic()
        receiver.stop()
        took = time.monotonic() - t0
        print(f"stop() with a trickling client took {took:.3f} s")
        assert took < STOP_BOUND_S
        reply = _reply(sock)
    finally:
        done.set()
        client.join()
        sock.close()
    assert reply.startswith("HTTP/1.0 503") and "stopped" in reply, reply
    assert [r.split()[0] for r in receiver.rejected] == ["503"]
    assert [s.name for s in receiver.spans()] == ["kept"]
    assert set(threading.enumerate()) - before == set()


def test_a_request_in_flight_at_stop_is_answered_and_counted() -> None:
    """Headers and half the body sent, the client silent: stop() answers it, and the
    request (and its half a body) never become spans."""
    body = _one_span_body()
    before = set(threading.enumerate())
    receiver = OtlpReceiver().start()
    sock = _raw(receiver.endpoint, len(body), body[: len(body) // 2])
    try:
        _wait_holding(receiver, 1)
        receiver.stop()
        reply = _reply(sock)
    finally:
        sock.close()
    assert reply.startswith("HTTP/1.0 503"), reply
    assert len(receiver.rejected) == 1 and receiver.spans() == []
    assert set(threading.enumerate()) - before == set()
    assert receiver.open_requests() == 0


def test_a_client_that_connects_and_says_nothing_does_not_hold_stop() -> None:
    receiver = OtlpReceiver().start()
    url = urlsplit(receiver.endpoint)
    sock = socket.create_connection((url.hostname or "127.0.0.1", url.port or 0), timeout=60)
    try:
        _wait_holding(receiver, 1)
        t0 = time.monotonic()
        receiver.stop()
        assert time.monotonic() - t0 < STOP_BOUND_S
        assert _reply(sock) == ""  # no request was made: nothing to answer or count
    finally:
        sock.close()
    assert receiver.rejected == []

