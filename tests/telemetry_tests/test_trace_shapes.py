"""Start-up and shutdown are traces of their own; kinds, remote parents and hosts are right."""

from __future__ import annotations

from pathlib import Path

from opentelemetry.trace import SpanKind, StatusCode

import telemetry
from executor import ExecutorConfig, MultiprocExecutor
from telemetry.assemble import read_run
from telemetry.otel import to_readable_spans


def _run(trace_dir: Path) -> list:
    telemetry.configure_process("driver")
    cfg = ExecutorConfig(worker="executor.workers:EchoWorker", tensor_parallel_size=2,
                         start_method="fork")
    with MultiprocExecutor(cfg) as ex:
        ex.collective_rpc("echo", args=(1,), timeout=10.0)
    telemetry.shutdown()
    return read_run(trace_dir)


def test_startup_ends_before_the_first_rpc_and_shutdown_is_its_own_trace(trace_dir: Path) -> None:
    spans = _run(trace_dir)
    startup = next(s for s in spans if s.name == "executor.startup")
    rpc = next(s for s in spans if s.name == "rpc echo")
    shutdown = next(s for s in spans if s.name == "executor.shutdown")
    assert startup.end_ns is not None and startup.end_ns <= rpc.start_ns
    in_startup = [s for s in spans if s.trace_id == startup.trace_id]
    assert all(s.name != "worker.death_pipe_eof" for s in in_startup)
    assert shutdown.parent_span_id == 0 and shutdown.trace_id not in (startup.trace_id, rpc.trace_id)
    assert all(s.parent_span_id == 0 for s in spans if s.name == "worker.death_pipe_eof")


def test_kinds_status_and_remote_parents(trace_dir: Path) -> None:
    spans = _run(trace_dir)
    sdk = {s.context.span_id: s for s in to_readable_spans(spans)}
    rpc = next(s for s in spans if s.name == "rpc echo")
    executes = [s for s in spans if s.name == "worker.execute echo"]
    enqueue = next(s for s in spans if s.name == "executor.enqueue")
    assert sdk[rpc.span_id].kind == SpanKind.CLIENT
    assert sdk[rpc.span_id].status.status_code == StatusCode.UNSET
    assert sdk[rpc.span_id].attributes["rpc.system.name"] == "faultlab"
    assert {sdk[s.span_id].kind for s in executes} == {SpanKind.SERVER}
    assert {sdk[s.span_id].name for s in executes} == {"worker.execute echo [rank 0]",
                                                       "worker.execute echo [rank 1]"}
    assert all(sdk[s.span_id].parent.is_remote for s in executes)
    assert sdk[enqueue.span_id].kind == SpanKind.PRODUCER
    assert not sdk[enqueue.span_id].parent.is_remote  # its parent is in the same process
    assert all(s.process.host for s in spans)  # host.name taken when the journal was made
