"""Trace context crosses process boundaries on the wire tuple; sampling follows the root."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest
from telemetry_children import serve_one_rpc

import telemetry
from telemetry import SpanContext


def _run_child(ctx: multiprocessing.context.BaseContext, wire: object) -> int:
    # The fork server keeps the environment it started with (an earlier test's): hand the
    # child this test's tracing variables explicitly, as the executor does.
    env = telemetry.tracing_env()
    proc = ctx.Process(target=serve_one_rpc, args=(wire, 0, env))  # type: ignore[attr-defined]
    proc.start()
    proc.join(30)
    assert proc.exitcode == 0
    return int(proc.pid)


def test_child_spans_join_parent_trace(
    trace_dir: Path, mp_context: multiprocessing.context.BaseContext,
) -> None:
    telemetry.configure_process("driver")
    rec = telemetry.get_recorder()
    rpc = rec.start_span("echo", attributes={"rpc.method": "echo"})
    child_pid = _run_child(mp_context, SpanContext.to_wire(rpc.context))
    rpc.end()

    df = telemetry.load_run(trace_dir)
    trace_id, span_id = f"{rpc.context.trace_id:032x}", f"{rpc.context.span_id:016x}"
    assert set(df.trace_id) == {trace_id}
    worker = df[df.pid == child_pid]
    by_name = {row.name: row for row in worker.itertuples()}
    assert set(by_name) == {"worker.dequeue", "echo", "worker.reply.enqueue", "worker.exit"}
    assert by_name["worker.dequeue"].parent_span_id == span_id
    assert by_name["echo"].parent_span_id == span_id
    assert by_name["worker.reply.enqueue"].parent_span_id == by_name["echo"].span_id
    assert by_name["worker.exit"].point
    assert df[df.span_id == span_id].parent_span_id.isna().all()


def test_unsampled_parent_records_nothing_in_child(
    trace_dir: Path, mp_context: multiprocessing.context.BaseContext,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_always_off")
    telemetry.configure_process("driver")
    rec = telemetry.get_recorder()
    rpc = rec.start_span("echo")
    wire = SpanContext.to_wire(rpc.context)
    assert wire is not None and wire[2] == 0 and rpc.context.trace_id and rpc.context.span_id
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_always_on")  # the child follows
    _run_child(mp_context, wire)
    rpc.end()
    assert len(telemetry.load_run(trace_dir)) == 0


def test_wire_round_trip() -> None:
    ctx = SpanContext(2**127 + 5, 2**63 + 7, True)
    wire = SpanContext.to_wire(ctx)
    assert wire == (ctx.trace_id, ctx.span_id, 1)
    assert SpanContext.from_wire(wire) == ctx
    assert SpanContext.to_wire(None) is None and SpanContext.from_wire(None) is None
    assert ctx.traceparent() == f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-01"


def test_off_by_default() -> None:
    telemetry.configure_process("driver")
    rec = telemetry.get_recorder()
    assert rec.enabled is False
    span = rec.start_span("x")
    assert not span.is_recording and span.context.span_id != 0
    span.end()


@pytest.mark.parametrize(("sampler", "arg", "low", "high"), [
    ("always_on", None, 1000, 1000),
    ("always_off", None, 0, 0),
    ("traceidratio", "0.25", 150, 350),
    ("parentbased_traceidratio", "0.01", 0, 40),
])
def test_root_sampling(
    trace_dir: Path, monkeypatch: pytest.MonkeyPatch, sampler: str, arg: str | None,
    low: int, high: int,
) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", sampler)
    if arg is not None:
        monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", arg)
    telemetry.configure_process("driver")
    rec = telemetry.get_recorder()
    for _ in range(1000):
        root = rec.start_span("root")
        rec.start_span("child", parent=root.context).end()
        root.end()
    df = telemetry.load_run(trace_dir)
    roots = df[df.name == "root"]
    assert low <= len(roots) <= high
    assert set(df[df.name == "child"].trace_id) == set(roots.trace_id)


def test_settings_from_env() -> None:
    from telemetry.config import Settings

    s = Settings.from_env({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
                           "OTEL_SERVICE_NAME": "svc", "OTEL_TRACES_SAMPLER": "traceidratio",
                           "OTEL_TRACES_SAMPLER_ARG": "0.5"})
    assert (s.enabled, s.exporter, s.protocol, s.service_name, s.sampler, s.sampler_ratio) == (
        True, "otlp", "grpc", "svc", "traceidratio", 0.5)
    assert not Settings.from_env({}).enabled
    assert not Settings.from_env({"OTEL_TRACES_EXPORTER": "none"}).enabled
    assert not Settings.from_env({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}).enabled
    assert Settings.from_env({"FAULTLAB_TRACE_DIR": "/x"}).enabled
    traces = Settings.from_env({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
                                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"})
    assert traces.protocol == "http/protobuf"
