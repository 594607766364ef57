"""Live OTLP export over HTTP and gRPC to a real receiver, across processes."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from otlp_receivers import GrpcReceiver, HttpReceiver, ReceivedSpans, base_name
from telemetry_children import record_and_die, run_as_second_driver, serve_one_rpc

import telemetry
from telemetry import SpanContext


@pytest.fixture(params=["http/protobuf", "grpc"])
def receiver(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Any:
    receiver: HttpReceiver | GrpcReceiver
    receiver = HttpReceiver() if request.param == "http/protobuf" else GrpcReceiver()
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", request.param)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "faultlab-test")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
    yield receiver
    telemetry.shutdown()
    receiver.close()


def _hex(raw: bytes) -> str:
    return raw.hex()


def _run(ctx: multiprocessing.context.BaseContext, target: Any, *args: Any) -> int:
    proc = ctx.Process(target=target, args=(*args, telemetry.tracing_env()))  # type: ignore[attr-defined]
    proc.start()
    proc.join(60)
    return int(proc.pid)


def _by_name(received: ReceivedSpans) -> dict[str, list[tuple[dict[str, Any], Any]]]:
    out: dict[str, list[tuple[dict[str, Any], Any]]] = {}
    for resource, span in received.spans():
        out.setdefault(base_name(span.name), []).append((resource, span))
    return out


@pytest.mark.parametrize("start_method", ["fork", "spawn", "forkserver"])
def test_live_export_joins_processes(
    receiver: ReceivedSpans, trace_dir: Path, start_method: str,
) -> None:
    telemetry.configure_process("driver")
    rec = telemetry.get_recorder()
    rpc = rec.start_span("echo", attributes={"rpc.method": "echo", "span.kind": "client"})
    ctx = multiprocessing.get_context(start_method)
    worker_pid = _run(ctx, serve_one_rpc, SpanContext.to_wire(rpc.context), 1)
    rpc.end()
    telemetry.shutdown()

    spans = _by_name(receiver)
    assert set(spans) == {"echo", "worker.dequeue", "worker.reply.enqueue", "worker.exit"}
    (driver_res, root), (worker_res, execute) = sorted(
        spans["echo"], key=lambda pair: pair[0]["faultlab.role"])
    assert driver_res["faultlab.role"] == "driver" and worker_res["faultlab.role"] == "worker"
    assert worker_res["faultlab.rank"] == 1 and worker_res["process.pid"] == worker_pid
    assert driver_res["process.pid"] == os.getpid()
    assert (driver_res["service.name"], worker_res["service.name"]) == (
        "faultlab-test driver", "faultlab-test worker rank 1")  # a service per role
    assert {driver_res["service.namespace"], worker_res["service.namespace"]} == {"faultlab-test"}
    assert worker_res["service.instance.id"] == f"worker rank 1 pid {worker_pid}"  # as the README
    trace_id = f"{rpc.context.trace_id:032x}"
    assert {_hex(s.trace_id) for _, s in receiver.spans()} == {trace_id}
    assert _hex(root.span_id) == f"{rpc.context.span_id:016x}" and root.parent_span_id == b""
    assert root.kind == root.SPAN_KIND_CLIENT
    assert _hex(execute.parent_span_id) == _hex(root.span_id)
    assert _hex(spans["worker.dequeue"][0][1].parent_span_id) == _hex(root.span_id)
    enqueue = spans["worker.reply.enqueue"][0][1]
    assert _hex(enqueue.parent_span_id) == _hex(execute.span_id)
    assert root.status.code == root.status.STATUS_CODE_UNSET  # success leaves the status unset
    assert root.start_time_unix_nano < execute.start_time_unix_nano < root.end_time_unix_nano


def test_killed_worker_spans_are_exported(receiver: ReceivedSpans, trace_dir: Path) -> None:
    telemetry.configure_process("driver")
    ctx = multiprocessing.get_context("fork")
    proc = ctx.Process(target=record_and_die, args=(20, "sigkill", 0, telemetry.tracing_env()))
    proc.start()
    proc.join(30)
    assert proc.exitcode == -signal.SIGKILL
    telemetry.shutdown()

    spans = _by_name(receiver)
    assert len(spans["worker.execute"]) == 20
    events = spans["worker.execute"][0][1].events
    assert [e.name for e in events] == ["chaos.fault"]
    (_, open_span), = spans["worker.open"]
    truncated = {kv.key: kv.value.bool_value for kv in open_span.attributes}
    assert truncated["faultlab.truncated"] is True
    assert open_span.status.code == open_span.status.STATUS_CODE_ERROR


def test_export_without_trace_dir_uses_and_removes_a_temp_dir(receiver: ReceivedSpans) -> None:
    telemetry.configure_process("driver")
    rec = telemetry.get_recorder()
    assert rec.enabled and rec.run_dir is not None
    run_dir = rec.run_dir
    rec.start_span("solo").end()
    telemetry.shutdown()
    assert [s.name for _, s in receiver.spans()] == ["solo"]
    assert not run_dir.exists()


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_unreachable_collector_does_not_stall_shutdown(
    trace_dir: Path, monkeypatch: pytest.MonkeyPatch, protocol: str,
) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")  # discard port
    monkeypatch.setenv("OTEL_BSP_EXPORT_TIMEOUT", "500")
    telemetry.configure_process("driver")
    rec = telemetry.get_recorder()
    for _ in range(1000):
        rec.start_span("kept").end()
    start = time.monotonic()
    telemetry.shutdown()
    assert time.monotonic() - start < 3.0
    assert len(telemetry.load_run(trace_dir)) == 1000  # the journal still has every span


def test_two_drivers_sharing_a_dir_export_each_span_once(
    receiver: ReceivedSpans, trace_dir: Path,
) -> None:
    telemetry.configure_process("driver")
    telemetry.get_recorder().start_span("first.driver").end()
    proc = multiprocessing.get_context("spawn").Process(
        target=run_as_second_driver, args=(telemetry.tracing_env(),))
    proc.start()
    proc.join(60)
    assert proc.exitcode == 0
    telemetry.shutdown()
    names = sorted(base_name(span.name) for _, span in receiver.spans())
    assert names == ["first.driver", "second.driver"]
